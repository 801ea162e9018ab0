"""Hostile peers against the orchestrator process, through the wire it shares with every
service: a captured heartbeat replayed from elsewhere spends nothing of the node's budget (it
keeps heartbeating and stays healthy), and one unservable value in a heartbeat is refused
instead of poisoning `GET /nodes`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from typing import Any
from urllib.request import urlopen

import aiohttp
import pytest
from yarl import URL

from meshrl.wire import SignedClient, sign_request
from meshrl.wire.models import (
    Heartbeat,
    HeartbeatAck,
    NodeState,
    PoolNodes,
    SlotRequest,
    UploadSlot,
)

from .conftest import Pool, next_counter, parquet_framed
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


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _cut(port: int, head: bytes, tail: bytes, close: bool = True) -> bytes:
    """One request whose head is `head` and whose body is `tail`; with `close` the peer then
    closes its side (the body cut short). Whatever the server answers is read back."""
    with socket.create_connection(("127.0.0.1", port), timeout=5,
                                  source_address=("127.0.0.7", 0)) as s:
        s.sendall(head + tail)
        if close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(4096):
                out += chunk
        return out


def test_cut_and_malformed_bodies_are_typed_refusals_not_tracebacks(pool: Pool) -> None:
    """The finding: 200 cut bodies logged 200 tracebacks, and so did a malformed one. A body
    that ends before its length (the peer closed), or whose chunked framing breaks midway,
    is `400 body_incomplete` and one log line each, on a JSON route and on a streamed upload;
    the service log holds no traceback and the node is still served."""
    url, aud = pool.orch.url, audience(pool.orch.url)
    port = _port(url)
    body = Heartbeat(policy_version=0).model_dump_json().encode()
    log_before = pool.orch.log.read_text()

    def head(path: str, method: str, extra: str, signed_body: bytes) -> bytes:
        h = sign_request(pool.key("n2"), method, path, signed_body, audience=aud).as_dict()
        return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}"
                + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode()

    answers = []
    for _ in range(40):  # the peer closes after part of its declared body
        answers.append(_cut(port, head("/heartbeat", "POST",
                                       f"Content-Length: {len(body)}\r\n", body), body[:7]))
    for _ in range(10):  # chunked: a good chunk, then one that is not a chunk
        answers.append(_cut(port, head("/heartbeat", "POST",
                                       "Transfer-Encoding: chunked\r\n", body),
                            b"5\r\n" + body[:5] + b"\r\nzz\r\n" + body[5:], close=False))
    # a streamed upload cut midway, through a slot granted for it
    data = parquet_framed(b"x" * 5000)
    sha = hashlib.sha256(data).hexdigest()

    async def grant() -> UploadSlot:
        async with SignedClient(url, pool.key("n2")) as c:
            return await c.call("POST", "/uploads", SlotRequest(
                sha256=sha, size=len(data), policy_version=3, work_units=10,
                counter=next_counter()), response=UploadSlot)
    slot = run(grant())
    path = "/uploads/" + slot.slot_id
    h = sign_request(pool.key("n2"), "PUT", path, b"", audience=aud,
                     body_sha256=sha).as_dict()
    upload_head = (f"PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
                   + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode()
    answers.append(_cut(port, upload_head, data[:3000]))
    # a streamed upload whose chunked framing breaks after its first chunk: refused at once,
    # not after the body's idle deadline (guard.body_idle_s, 30 s)
    chunked_head = upload_head.replace(f"Content-Length: {len(data)}".encode(),
                                       b"Transfer-Encoding: chunked")
    t0 = time.monotonic()
    answers.append(_cut(port, chunked_head, b"200\r\n" + data[:512] + b"\r\nzz\r\n",
                        close=False))
    chunked_s = time.monotonic() - t0
    time.sleep(0.5)  # the server has read every cut (its log lines are written)
    log = pool.orch.log.read_text()[len(log_before):]
    assert "Traceback" not in log, log[log.find("Traceback") - 200:][:3000]
    cut = [json.loads(line) for line in log.splitlines()
           if line.startswith("{") and '"request body cut"' in line]
    cut = [line for line in log.splitlines() if line.startswith("{") and (
        '"request body cut"' in line or '"malformed request"' in line)]
    assert len(cut) == 52, (len(cut), log[-2000:])  # one line each
    # a typed refusal to each peer still reading (one that closed has no one to answer)
    framing = answers[40:50] + answers[51:]
    assert chunked_s < 2, chunked_s
    assert all(a.split(b"\r\n")[0].endswith(b"400 Bad Request") and b'"code":"http_refused"'
               in a for a in framing), framing[:2]

    async def after() -> None:  # the slot is free again and the node served
        async with SignedClient(url, pool.key("n2")) as c:
            await c.call("POST", "/heartbeat", Heartbeat(policy_version=0),
                         response=HeartbeatAck)
            (pool.tmp / "whole").write_bytes(data)
            await c.upload("PUT", slot.url, pool.tmp / "whole", sha)
    run(after())


def test_openapi_is_served_from_one_copy_within_a_per_ip_rate(pool: Pool) -> None:
    """The finding: `/openapi.json` was rebuilt per unsigned request (49% of a core, the
    heartbeat's p50 3 -> 67 ms). It is serialised once, answered 304 to a reader that holds
    it (ETag), and each IP may read it `docs_per_minute` times a minute (burst 10): a flood
    from one IP is `429 ip_rate_limited` while heartbeats go on."""
    url = pool.orch.url

    async def t() -> tuple[dict[int, int], str, int]:
        conn = aiohttp.TCPConnector(local_addr=("127.0.0.8", 0))
        statuses: dict[int, int] = {}
        etag = ""
        async with aiohttp.ClientSession(connector=conn) as s:
            for _ in range(40):
                async with s.get(url + "/openapi.json") as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    etag = r.headers.get("ETag", etag)
        async with aiohttp.ClientSession() as s, s.get(
                url + "/openapi.json", headers={"If-None-Match": etag}) as r:
            again = r.status
        return statuses, etag, again
    statuses, etag, again = run(t())
    assert etag and again == 304
    assert statuses[200] <= 12 and statuses[429] >= 28, statuses
