"""What an unsigned `GET /join` costs the pool, and what it tells (issue #41). A real
orchestrator process reads its chain through a counting JSON-RPC proxy (aiohttp on loopback in
front of anvil, counting calls by method):

- 300 concurrent `/join` requests at a cold or expired cache cost one read of the chain
  (2 `eth_getCode`), not one read each; every answer carries the same manager signature;
- the manifest names neither the orchestrator's RPC (an API key in its query and userinfo)
  nor the credentials of the public one it was told to publish;
- with the chain's RPC down, `/join` answers `503 chain_unavailable` in one line of JSON, the
  log holds no traceback, and a crowd then costs no call per request.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from meshrl.pool import JoinManifest
from meshrl.protocol.signing import recover_digest

from .conftest import orchestrator_config
from .net import Chain, Service, start_chain

pytestmark = pytest.mark.anvil
SECRET = "sekrit-api-key-41"
N = 300


class CountingRpc:
    """A JSON-RPC proxy in its own thread: forwards to `upstream`, counts each call's method;
    `down()` stops it for good (connections refused from then on)."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.calls = upstream, Counter[str]()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._lock = threading.Lock()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            calls = json.loads(body)
            with self._lock:
                for c in calls if isinstance(calls, list) else [calls]:
                    self.calls[c.get("method", "?")] += 1
            async with self._session.post(self.upstream, data=body, headers={
                    "Content-Type": "application/json"}) as r:
                return web.Response(body=await r.read(), status=r.status,
                                    content_type="application/json")

        app = web.Application()
        app.router.add_post("/{tail:.*}", forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> CountingRpc:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def count(self, method: str) -> int:
        with self._lock:
            return self.calls[method]

    def down(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
            await self._session.close()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def orch(tmp_path_factory) -> Iterator[tuple[Service, CountingRpc, Chain]]:
    tmp: Path = tmp_path_factory.mktemp("joinbudget")
    chain = start_chain(tmp)
    proxy = CountingRpc(chain.node.url)
    o: Service | None = None
    try:
        proxy.start()
        # the orchestrator's own RPC carries an API key, as a provider's URL does
        cfg = orchestrator_config(chain, tmp)
        cfg["chain"]["rpc_url"] = (f"http://meshrl:{SECRET}@127.0.0.1:{proxy.port}/v2/"
                                   f"?apikey={SECRET}")
        cfg["join"] = {"cache_s": 2.0, "rpc_url": (f"https://pub:{SECRET}@rpc.example.org:8545"
                                                   f"/v1?key={SECRET}#frag")}
        o = Service("orchestrator", cfg, tmp)
        o.start()
        yield o, proxy, chain
    finally:
        if o is not None:
            o.stop()
        proxy.close()
        chain.close()


async def _crowd(url: str, n: int) -> list[tuple[int, bytes, float]]:
    conn = aiohttp.TCPConnector(limit=200)  # below the orchestrator's connections per IP
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one() -> tuple[int, bytes, float]:
            t0 = time.monotonic()
            async with s.get(url + "/join") as r:
                return r.status, await r.read(), time.monotonic() - t0
        return await asyncio.gather(*(one() for _ in range(n)))


def test_a_crowd_at_cache_expiry_costs_one_chain_read(orch) -> None:
    o, proxy, chain = orch
    out = {}
    for wave in ("cold", "expired"):
        before = proxy.count("eth_getCode")
        t0 = time.monotonic()
        answers = asyncio.run(_crowd(o.url, N))
        wall = time.monotonic() - t0
        code_calls = proxy.count("eth_getCode") - before
        assert [a[0] for a in answers] == [200] * N
        ms = [JoinManifest.model_validate_json(a[1]) for a in answers]
        assert len({(m.digest(), m.signature) for m in ms}) == 1  # one read, signed once
        signer = recover_digest(ms[0].digest(), bytes.fromhex(ms[0].signature[2:]))
        assert signer == ms[0].signer == chain.accounts["mgr"].address
        assert code_calls <= 2, code_calls  # one read of the facts: 2 eth_getCode
        out[wave] = {"requests": N, "eth_getCode": code_calls, "wall_s": round(wall, 2),
                     "p50_s": round(statistics.median(a[2] for a in answers), 3)}
        time.sleep(2.5)  # past join.cache_s: the next wave finds the facts stale
    print(json.dumps({"join_crowd": out}))


def test_the_manifest_never_names_the_orchestrators_rpc_or_credentials(orch) -> None:
    o, _, _ = orch
    body = asyncio.run(_crowd(o.url, 1))[0][1]
    assert SECRET not in body.decode() and "meshrl:" not in body.decode()
    m = JoinManifest.model_validate_json(body)
    assert m.rpc_url == "https://rpc.example.org:8545/v1"  # the public one, bare


def test_join_with_the_chain_down_answers_503_in_one_line(orch) -> None:
    o, proxy, _ = orch
    time.sleep(2.5)  # the cached facts expire
    proxy.down()
    t0 = time.monotonic()
    answers = asyncio.run(_crowd(o.url, 50))
    took = time.monotonic() - t0
    assert {a[0] for a in answers} == {503}, answers[0]
    err = json.loads(answers[0][1])
    assert err["code"] == "chain_unavailable" and "\n" not in err["detail"], err
    assert took < 30
    log = o.log.read_text()
    lines = [x for x in log.splitlines() if "join manifest unavailable" in x]
    assert len(lines) == 1, log[-3000:]  # said once, not per request
    assert "Traceback" not in log, log[-3000:]
