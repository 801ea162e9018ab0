"""`kill -9` of an orchestrator under load, then a restart: every acknowledged upload is in the
ledger and on disk with its sha256, and the nodes go on heartbeating without being ejected."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_account import Account

from meshrl.wire import CounterUsed, FileAlreadyUploaded, SignedClient, WireHTTPError
from meshrl.wire.models import PoolNodes, SlotRequest, UploadSlot
from meshrl.wire.signing import orchestrator_audience, sign_request

from .conftest import Pool, next_counter, orchestrator_config, parquet_framed
from .net import Heartbeater, Service, hexkey, run, wait_for

pytestmark = pytest.mark.anvil


def _own_pool(pool: Pool, name: str, members: int) -> tuple[Service, str, list[Any], int]:
    """A pool of its own on the shared chain with `members` nodes joined, and its orchestrator
    process (not started) on a fixed port, so a restarted process has the same URL."""
    chain, tmp = pool.chain, pool.tmp / name
    tmp.mkdir()
    mgr = chain.client("mgr")
    fed = chain.fed
    pool_id = fed.create_pool(fed.pool(chain.pool).domain, mgr.address, 10**15)
    fed.start_pool(pool_id)
    nodes = [Account.from_key(hashlib.sha256(f"{name}-{i}".encode()).digest())
             for i in range(members)]
    p2 = chain.client("p2")
    for n in nodes:
        fed.backend.fund(n.address, 10**20)
        p2.add_node(n, 1)
        exp = fed.backend.now() + 600
        chain.fed.as_(n).join_pool(pool_id, n.address, 1, exp,
                                   mgr.sign_invite(pool_id, n.address, 1, exp))
    # port 0: the first start binds a free port (a port picked and released first could be
    # taken before it binds); _start_pinned keeps it for the restart
    cfg = orchestrator_config(chain, tmp, port=0, pool_id=pool_id, db=str(tmp / "orch.db"),
                              store={"root": str(tmp / "files")})
    return Service("orchestrator", cfg, tmp), str(tmp), nodes, pool_id


def _start_pinned(orch: Service) -> str:
    """Start `orch` and pin its config to the port it bound, so a restart serves the same URL."""
    url = orch.start()
    text = orch.config.read_text()
    assert text.startswith("port = 0\n"), text[:40]
    orch.config.write_text(f"port = {int(url.rsplit(':', 1)[1])}\n" + text[len("port = 0\n"):])
    return url


def _wait_members(pool: Pool, url: str, count: int) -> None:
    """Block until the orchestrator at `url` has indexed `count` healthy members from the chain
    (a request signed by a node it has not yet seen join is refused `not_in_pool`)."""
    async def members() -> int:
        async with SignedClient(url, pool.key("trainer")) as t:
            got = await t.call("GET", "/nodes", response=PoolNodes)
            return sum(n.state.value in ("healthy", "unhealthy") for n in got.nodes)
    deadline = time.monotonic() + 15
    while run(members()) < count:
        assert time.monotonic() < deadline, "joined nodes did not show up"
        time.sleep(0.2)


def test_an_upload_cut_by_a_kill_is_delivered_once(pool: Pool) -> None:
    """kill -9 of the orchestrator in the middle of an upload: after the restart the same slot
    takes the file (it was left `uploading`), asking for a slot again says it is stored; a
    grant the worker lost is granted again (no 409 until expiry); each file is stored once."""
    orch, tmp, [node], pool_id = _own_pool(pool, "cut", 1)
    audience = orchestrator_audience(pool.chain.fed.backend.chain_id, pool_id)
    url = _start_pinned(orch)
    _wait_members(pool, url, 1)
    k = hexkey(node)
    data = parquet_framed(os.urandom(1 << 20))
    sha = hashlib.sha256(data).hexdigest()
    path = pool.tmp / "cut.parquet"
    path.write_bytes(data)
    req = SlotRequest(sha256=sha, size=len(data), policy_version=3, work_units=1,
                      counter=0)

    async def cut() -> UploadSlot:
        async with SignedClient(url, k) as c:
            slot = await c.call("POST", "/uploads", req, response=UploadSlot)
            headers = sign_request(k, "PUT", slot.url, body_sha256=sha, address=node.address,
                                   audience=audience).as_dict()
            headers["content-length"] = str(len(data))

            async def half() -> AsyncIterator[bytes]:
                yield data[: len(data) // 2]
                await asyncio.to_thread(orch.kill9)  # the rest never comes
                yield data[len(data) // 2:]
            with pytest.raises((aiohttp.ClientError, OSError)):
                async with aiohttp.ClientSession() as http:
                    await http.put(url + slot.url, data=half(), headers=headers)
            return slot

    async def finish(slot: UploadSlot) -> tuple[Any, Any]:
        async with SignedClient(url, k) as c:
            receipt = await c.upload("PUT", slot.url, path, sha)  # the same slot, once more
            with pytest.raises(FileAlreadyUploaded):
                await c.call("POST", "/uploads", req)
            # a grant lost in a crash: the next file's slot is granted again, at once
            other = parquet_framed(os.urandom(1000))
            (pool.tmp / "lost.parquet").write_bytes(other)
            sha2 = hashlib.sha256(other).hexdigest()
            req2 = req.model_copy(update={"sha256": sha2, "size": len(other), "counter": 1})
            await c.call("POST", "/uploads", req2, response=UploadSlot)  # lost
            again = await c.call("POST", "/uploads", req2, response=UploadSlot)
            with pytest.raises(CounterUsed):  # but no other file at its counter
                await c.call("POST", "/uploads", req2.model_copy(update={"sha256": "ab" * 32}))
            return receipt, await c.upload("PUT", again.url, pool.tmp / "lost.parquet", sha2)
    try:
        slot = run(cut())
        assert orch.start() == url
        _wait_members(pool, url, 1)
        first, second = run(finish(slot))
        assert first["status"] == second["status"] == "uploaded"
    finally:
        orch.stop()
    stored = sorted(p.name for p in (Path(tmp) / "files").glob("*/*.parquet"))
    assert stored == sorted(f"{h}.parquet" for h in (sha, hashlib.sha256(
        (pool.tmp / "lost.parquet").read_bytes()).hexdigest()))
    assert (Path(tmp) / "files" / sha[:2] / f"{sha}.parquet").read_bytes() == data


@pytest.mark.slow
def test_kill9_under_load_loses_nothing_acknowledged(pool: Pool) -> None:
    orch, tmp_s, nodes, pool_id = _own_pool(pool, "crash", 4)
    tmp, fed = Path(tmp_s), pool.chain.fed
    url = _start_pinned(orch)
    keys = [hexkey(n) for n in nodes]
    _wait_members(pool, url, 4)
    beats = Heartbeater(url, keys, every=0.3)
    acked: dict[str, int] = {}

    async def uploader(k: str, i: int, stop: asyncio.Event) -> None:
        async with SignedClient(url, k) as c:
            n = 0
            while not stop.is_set():
                data = parquet_framed(os.urandom(200_000))
                path = tmp / f"u{i}-{n}"
                path.write_bytes(data)
                sha = hashlib.sha256(data).hexdigest()
                try:
                    slot = await c.call("POST", "/uploads", SlotRequest(
                        sha256=sha, size=len(data), policy_version=3, work_units=1,
                        counter=next_counter()),
                        response=UploadSlot)
                    await c.upload("PUT", slot.url, path, sha)
                    acked[sha] = len(data)
                except (TimeoutError, WireHTTPError, aiohttp.ClientError, OSError):
                    await asyncio.sleep(0.1)
                n += 1

    async def load() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(uploader(k, i, stop)) for i, k in enumerate(keys)]
        deadline = time.monotonic() + 60
        while len(acked) < 8:  # under load: uploads acknowledged, more in flight
            assert time.monotonic() < deadline, f"only {len(acked)} uploads acknowledged"
            await asyncio.sleep(0.05)
        await asyncio.to_thread(orch.kill9)  # mid-upload: nothing is shut down cleanly
        stop.set()
        await asyncio.gather(*tasks)

    async def states() -> PoolNodes:
        async with SignedClient(orch.url, pool.key("trainer")) as t:
            return await t.call("GET", "/nodes", response=PoolNodes)
    try:
        run(load())
        assert orch.start() == url
        restarted = time.time()
        seen: set[str] = set()

        async def beating_past_the_dead_line() -> PoolNodes | None:
            """Every node's heartbeat taken more than 3 missed intervals (of 1 s) after the
            restart: had the restart counted the outage as silence, they would be ejected
            by then (and their heartbeats refused)."""
            got = await states()
            seen.update(n.state.value for n in got.nodes)
            late = len(got.nodes) == 4 and all(n.last_seen > restarted + 4.0 for n in got.nodes)
            return got if late else None
        after = run(wait_for(beating_past_the_dead_line, timeout=60))
        assert not seen & {"dead", "ejected"}, seen
        assert {n.state.value for n in after.nodes} == {"healthy"}
        assert all(fed.node(n.address).pool == pool_id for n in nodes)
    finally:
        beats.stop()
        orch.stop()
    db = sqlite3.connect(tmp / "orch.db")
    rows = dict(db.execute("SELECT sha256, status FROM files"))
    for sha, size in acked.items():
        assert rows[sha] == "uploaded"
        stored = tmp / "files" / sha[:2] / f"{sha}.parquet"
        assert stored.stat().st_size == size
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha
    assert not list((tmp / "files" / "tmp").iterdir())  # the partial upload was cleaned up
