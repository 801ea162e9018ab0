"""`kill -9` of an orchestrator under load, then a restart: every acknowledged upload is in the
ledger and on disk with its sha256, and the nodes go on heartbeating without being ejected."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import sqlite3
import time

import aiohttp
import pytest
from eth_account import Account

from meshrl.wire import SignedClient, WireHTTPError
from meshrl.wire.models import PoolNodes, SlotRequest, UploadSlot

from .conftest import Pool, orchestrator_config
from .net import Heartbeater, Service, hexkey, run, wait_for

pytestmark = pytest.mark.anvil


@pytest.mark.slow
def test_kill9_under_load_loses_nothing_acknowledged(pool: Pool) -> None:
    chain, tmp = pool.chain, pool.tmp / "crash"
    tmp.mkdir()
    mgr = chain.client("mgr")
    fed = chain.fed
    pool_id = fed.create_pool(fed.pool(chain.pool).domain, mgr.address, 10**15)
    fed.start_pool(pool_id)
    nodes = [Account.from_key(hashlib.sha256(f"crash-{i}".encode()).digest()) for i in range(4)]
    p2 = chain.client("p2")
    for n in nodes:
        fed.backend.fund(n.address, 10**20)
        p2.add_node(n, 1)
        exp = fed.backend.now() + 600
        chain.fed.as_(n).join_pool(pool_id, n.address, 1, exp,
                                   mgr.sign_invite(pool_id, n.address, 1, exp))
    with socket.socket() as s:  # a fixed port, so the restarted process has the same URL
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = orchestrator_config(chain, tmp, port=port, pool_id=pool_id, db=str(tmp / "orch.db"),
                              store={"root": str(tmp / "files")})
    orch = Service("orchestrator", cfg, tmp)
    url = orch.start()
    keys = [hexkey(n) for n in nodes]

    async def members() -> int:
        async with SignedClient(url, pool.key("trainer")) as t:
            got = await t.call("GET", "/nodes", response=PoolNodes)
            return sum(n.state.value == "healthy" for n in got.nodes)
    deadline = time.monotonic() + 15
    while run(members()) < 4:
        assert time.monotonic() < deadline, "joined nodes did not show up"
        time.sleep(0.2)
    beats = Heartbeater(url, keys, every=0.3)
    acked: dict[str, int] = {}

    async def uploader(k: str, i: int, stop: asyncio.Event) -> None:
        async with SignedClient(url, k) as c:
            n = 0
            while not stop.is_set():
                data = os.urandom(200_000)
                path = tmp / f"u{i}-{n}"
                path.write_bytes(data)
                sha = hashlib.sha256(data).hexdigest()
                try:
                    slot = await c.call("POST", "/uploads", SlotRequest(
                        sha256=sha, size=len(data), step=3, policy_version=3, work_units=1),
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
