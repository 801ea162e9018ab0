"""Hostile peers against the orchestrator process, through the wire it shares with every
service: a captured heartbeat replayed from elsewhere spends nothing of the node's budget (it
keeps heartbeating and stays healthy), and one unservable value in a heartbeat is refused
instead of poisoning `GET /nodes`."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.request import urlopen

import aiohttp
import pytest
from yarl import URL

from meshrl.wire import SignedClient, sign_request
from meshrl.wire.models import Heartbeat, HeartbeatAck, NodeState, PoolNodes

from .conftest import Pool
from .net import run

pytestmark = pytest.mark.anvil


def audience(url: str) -> str:
    with urlopen(url + "/identity", timeout=30) as r:
        return str(json.load(r)["audience"])


async def send(url: str, path: str, body: bytes, headers: dict[str, str],
               source: str) -> tuple[int, Any]:
    conn = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=conn) as s, s.post(
            URL(url + path, encoded=True), data=body, headers=headers) as r:
        data = await r.read()
        return r.status, json.loads(data) if data else None


def test_replayed_heartbeats_do_not_get_the_node_rate_limited(pool: Pool) -> None:
    url, aud = pool.orch.url, audience(pool.orch.url)
    body = Heartbeat(policy_version=0, step=0).model_dump_json().encode()
    captured = sign_request(pool.key("n1"), "POST", "/heartbeat", body, audience=aud).as_dict()

    async def t() -> None:
        assert (await send(url, "/heartbeat", body, captured, "127.0.0.1"))[0] == 200
        conn = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=16)
        codes: dict[str, int] = {}
        async with aiohttp.ClientSession(connector=conn) as s:
            async def replay() -> None:
                async with s.post(url + "/heartbeat", data=body, headers=captured) as r:
                    code = (await r.json())["code"]
                    codes[code] = codes.get(code, 0) + 1
            # ten times the node's burst (40), faster than its rate refills it
            await asyncio.gather(*(replay() for _ in range(400)))
        assert codes == {"replayed_nonce": 400}, codes
        # the node's own heartbeats are still served, and it is healthy
        async with SignedClient(url, pool.key("n1")) as c:
            for _ in range(5):
                ack = await c.call("POST", "/heartbeat", Heartbeat(policy_version=0),
                                   response=HeartbeatAck)
                assert ack.state is NodeState.HEALTHY
        async with SignedClient(url, pool.key("trainer")) as t:
            nodes = await t.call("GET", "/nodes", response=PoolNodes)
        n1 = next(n for n in nodes.nodes if n.address == pool.chain.accounts["n1"].address)
        assert n1.state is NodeState.HEALTHY and time.time() - n1.last_seen < 5
    run(t())


@pytest.mark.parametrize("field, value", [("tokens_per_s", "1e999"), ("tokens_per_s", "NaN"),
                                          ("step", "9223372036854775808"),
                                          ("files_pending", "18446744073709551616"),
                                          ("policy_version", "1" + "0" * 30)])
def test_an_unservable_heartbeat_value_poisons_nothing(pool: Pool, field: str,
                                                       value: str) -> None:
    url, aud = pool.orch.url, audience(pool.orch.url)
    data = Heartbeat(policy_version=0).model_dump()
    data[field] = "@@"
    body = json.dumps(data).replace('"@@"', value).encode()
    h = sign_request(pool.key("n2"), "POST", "/heartbeat", body, audience=aud).as_dict()

    async def t() -> None:
        status, ans = await send(url, "/heartbeat", body, h, "127.0.0.1")
        assert (status, ans["code"]) == (422, "invalid_body"), ans
        async with SignedClient(url, pool.key("trainer")) as c:  # still served, and parses
            nodes = await c.call("GET", "/nodes", response=PoolNodes)
        assert all(n.tokens_per_s < 1e12 for n in nodes.nodes)
    run(t())
