"""Hostile peers against a real service of the shared wire stack (`hostile_service.py`, its own
process, on loopback; each attacker has its own source IP in 127.0.0.0/8). Every attack has a
legitimate control that still succeeds, and while and after it runs the service keeps
answering: `/health` under 1 s, honest requests within 2x their latency before the attack."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshrl.wire import (
    ErrorCode,
    RateLimited,
    SignedClient,
    WireHTTPError,
    WrongAudience,
    raise_for,
    sign_request,
)
from meshrl.wire.models import Heartbeat

from .hostile_http import (
    HONEST_KEY,
    HostileService,
    closed_by_server,
    connect_from,
    dropped,
    health_seconds,
    honest_latencies,
    in_process,
    median_ms,
    metrics,
    send,
)

AUD = "meshrl/31337/test/hostile"
HB = Heartbeat(step=1).model_dump_json().encode()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def guarded(**cfg: Any) -> pytest.MarkDecorator:
    """The test's service runs with this configuration."""
    return pytest.mark.parametrize("service", [cfg], indirect=True)


@pytest.fixture
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HostileService]:
    kw = getattr(request, "param", {})
    svc = HostileService(tmp_path, **kw).start()
    try:
        yield svc
    finally:
        svc.stop()


def code_of(answer: Any) -> str:
    return answer["code"] if isinstance(answer, dict) else ""


# --- 1. nobody spends another's budget ------------------------------------------------------

@pytest.mark.timing
@guarded(rate_per_minute=60, rate_burst=5)
def test_replays_and_forgeries_spend_no_one_elses_budget(service: HostileService) -> None:
    url = service.url

    async def t() -> None:
        captured = sign_request(HONEST_KEY, "POST", "/heartbeat", HB, audience=AUD).as_dict()
        assert (await send(url, "POST", "/heartbeat", HB, captured))[0] == 200
        # an attacker replays the captured heartbeat and forges others in the node's name
        for _ in range(60):
            status, ans = await send(url, "POST", "/heartbeat", HB, captured, "127.0.0.2")
            assert (status, code_of(ans)) == (409, "replayed_nonce")
        forged = sign_request("0x" + "22" * 32, "POST", "/heartbeat", HB, audience=AUD)
        forged_h = {**forged.as_dict(), "x-address": captured["x-address"]}
        for _ in range(20):
            status, ans = await send(url, "POST", "/heartbeat", HB, forged_h, "127.0.0.2")
            assert (status, code_of(ans)) == (401, "wrong_signer")
        assert await health_seconds(url) < 1.0
        # the node still has the 4 requests left of its burst of 5 ...
        async with SignedClient(url, HONEST_KEY) as c:
            for _ in range(4):
                await c.call("POST", "/heartbeat", Heartbeat(step=1))
            # ... and the limit still holds for its own requests (the control)
            with pytest.raises(RateLimited):
                await c.call("POST", "/heartbeat", Heartbeat(step=1))
            status, ans = await send(url, "POST", "/heartbeat", HB, captured)
            assert (status, code_of(ans)) == (409, "replayed_nonce")  # still a replay
    run(t())


# --- 2. a signature is for one audience ------------------------------------------------------

def test_a_request_signed_for_one_service_is_refused_by_another(tmp_path: Path) -> None:
    a = HostileService(tmp_path, audience="meshrl/31337/orchestrator/1", name="a").start()
    b = HostileService(tmp_path, audience="meshrl/31337/orchestrator/2", name="b").start()
    try:
        async def t() -> None:
            for_a = sign_request(HONEST_KEY, "POST", "/heartbeat", HB,
                                 audience="meshrl/31337/orchestrator/1").as_dict()
            status, ans = await send(b.url, "POST", "/heartbeat", HB, for_a)
            assert (status, code_of(ans)) == (401, "wrong_audience")
            # claiming B's audience over A's signature recovers someone else
            status, ans = await send(b.url, "POST", "/heartbeat", HB,
                                     {**for_a, "x-audience": "meshrl/31337/orchestrator/2"})
            assert (status, code_of(ans)) == (401, "wrong_signer")
            other_chain = sign_request(HONEST_KEY, "POST", "/heartbeat", HB,
                                       audience="meshrl/1/orchestrator/2").as_dict()
            assert code_of((await send(b.url, "POST", "/heartbeat", HB, other_chain))[1]) \
                == "wrong_audience"
            async with aiohttp.ClientSession() as s, s.get(b.url + "/stored") as r:
                assert (await r.json())["count"] == 0  # B stored nothing
            # the controls: A takes its own request; clients learn or are told the audience
            assert (await send(a.url, "POST", "/heartbeat", HB, for_a))[0] == 200
            async with aiohttp.ClientSession() as s, s.get(b.url + "/identity") as r:
                assert (await r.json())["audience"] == "meshrl/31337/orchestrator/2"
            async with SignedClient(b.url, HONEST_KEY) as c:
                await c.call("POST", "/heartbeat", Heartbeat())
                assert await c.audience() == "meshrl/31337/orchestrator/2"
            async with SignedClient(b.url, HONEST_KEY,
                                    audience="meshrl/31337/orchestrator/1") as c:
                with pytest.raises(WrongAudience):
                    await c.call("POST", "/heartbeat", Heartbeat())
        run(t())
    finally:
        a.stop()
        b.stop()


def test_a_client_relearns_the_audience_when_another_service_takes_its_url(
        tmp_path: Path) -> None:
    """Clients share what a URL's service named; when another service answers at that URL (a
    pool's orchestrator restarted on a reused port), the refused request is signed again for
    the audience read anew from /identity (`SignedClient._send`, the one path of every kind of
    request)."""
    a = HostileService(tmp_path, audience="meshrl/31337/orchestrator/1", name="a").start()
    url, port = a.url, a.port
    b = None
    try:
        async def learn() -> None:
            async with SignedClient(url, HONEST_KEY) as c:
                await c.call("POST", "/heartbeat", Heartbeat())
                assert await c.audience() == "meshrl/31337/orchestrator/1"
        run(learn())
        a.stop()
        b = HostileService(tmp_path, audience="meshrl/31337/orchestrator/2", name="b",
                           port=port).start()
        assert b.url == url

        async def again() -> None:
            async with SignedClient(url, HONEST_KEY) as c:  # a new client, the shared memory
                await c.call("POST", "/heartbeat", Heartbeat())
                assert await c.audience() == "meshrl/31337/orchestrator/2"
        run(again())
    finally:
        a.stop()
        if b is not None:
            b.stop()


# --- 3. one bad value poisons nothing ---------------------------------------------------------

EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "/heartbeat": ("POST", {"policy_version": 1, "step": 2, "tokens_per_s": 3.5,
                            "files_pending": 4}),
    "/uploads": ("POST", {"sha256": "ab" * 32, "size": 10, "policy_version": 0,
                          "work_units": 3, "counter": 0}),
    "/verdicts": ("POST", {"sha256": "ab" * 32, "verdict": "accept", "reason": "ok",
                           "work_id": "cd" * 32}),
    "/step": ("POST", {"step": 3}),
    "/nodes": ("PUT", {"provider": "0x" + "12" * 20, "pool_id": 1, "endpoints": ["http://x"],
                       "hardware": {"cores": 8, "memory_gb": 32.0, "accelerators": [
                           {"name": "H100", "memory_gb": 80.0, "count": 2}]},
                       "software": {"meshrl": "0.1"}}),
}
# raw JSON tokens: what json.dumps never writes but a peer can
HOSTILE = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "9223372036854775808",
           "-9223372036854775809", "18446744073709551616", "1" + "0" * 400, '"\\ud800"',
           '"a\\udfffb"', "1.5e308", '"' + "x" * 5000 + '"']
MARK = "@@hostile@@"


def _leaves(x: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every value's path, and (as ('key', path)) every dict key's."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield ("key", *path, k)
            yield from _leaves(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _with(example: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    data = json.loads(json.dumps(example))
    if path and path[0] == "key":
        *where, key = path[1:]
        target = data
        for p in where:
            target = target[p]
        target[MARK] = target.pop(key)
        return data
    target = data
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = MARK
    return data


@pytest.mark.timing
@guarded(rate_per_minute=100_000, rate_burst=100_000)
def test_every_field_with_an_unservable_value_is_a_typed_4xx(service: HostileService) -> None:
    url = service.url
    refusals = {"invalid_body", "malformed_json"}

    async def t() -> int:
        sent = 0
        async with SignedClient(url, HONEST_KEY) as c:
            for path, (method, example) in EXAMPLES.items():
                await c.call(method, path, example)  # the control: the example is served
                for leaf in _leaves(example):
                    values = ['"\\ud800"'] if leaf[0] == "key" else HOSTILE
                    for value in values:
                        text = json.dumps(_with(example, leaf)).replace(f'"{MARK}"', value)
                        body = text.encode()
                        h = sign_request(HONEST_KEY, method, path, body, audience=AUD).as_dict()
                        status, ans = await send(url, method, path, body, h)
                        sent += 1
                        if value == "1.5e308" and status == 200:
                            continue  # finite: a float field may take it within its bound
                        assert 400 <= status < 500 and code_of(ans) in refusals, \
                            (path, leaf, value[:30], status, ans)
            # the query's fields too (as text: what a URL carries)
            for name in ("policy_version", "after", "accepted_after", "limit", "sha256", "status"):
                for value in ("1e999", "9223372036854775808", "%D9%A1%D9%A2", "%ED%A0%80",
                              "%FF", "NaN", "\u0661\u0662"):
                    q = f"/ledger?{name}={value}"
                    h = sign_request(HONEST_KEY, "GET", q, b"", audience=AUD).as_dict()
                    status, ans = await send(url, "GET", q, b"", h)
                    sent += 1
                    # raw non-ASCII in the request line is refused by the HTTP parser
                    want = {"invalid_query"} | ({"http_refused"} if value.isdigit() else set())
                    assert 400 <= status < 500 and code_of(ans) in want, \
                        (name, value, status, ans)
        # nothing stored that cannot be served back: the examples, and nothing else
        async with aiohttp.ClientSession() as s, s.get(url + "/stored") as r:
            assert r.status == 200 and (await r.json())["count"] == len(EXAMPLES)
        assert await health_seconds(url) < 1.0
        return sent
    assert run(t()) > 300


def _raw(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """A request written byte for byte (header values as UTF-8); its status and JSON."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.encode("utf-8") + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    payload = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(payload) if payload else {}


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


@pytest.mark.parametrize("timestamp", ["\u0661\u0667\u0660\u0660", "\u00b9\u00b2\u00b3",
                                       "\uff11\uff12\uff13", "1_700_000_000", "+1700000000",
                                       "1700000000.5", "-1"])
@pytest.mark.timing
def test_non_ascii_or_odd_timestamp_digits_are_malformed(service: HostileService,
                                                         timestamp: str) -> None:
    h = sign_request(HONEST_KEY, "POST", "/heartbeat", HB, audience=AUD).as_dict()
    h["x-timestamp"] = timestamp
    head = "POST /heartbeat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in h.items()) + f"Content-Length: {len(HB)}\r\n\r\n"
    status, ans = _raw(service.port, head, HB)
    assert (status, ans.get("code")) == (400, "malformed_timestamp")
    assert run(health_seconds(service.url)) < 1.0


# --- 5. a body however it arrives ---------------------------------------------------------

def _signed_head(path: str, body: bytes, extra: str) -> bytes:
    h = sign_request(HONEST_KEY, "POST", path, body, audience=AUD).as_dict()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + extra + "\r\n").encode()


def _answer(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[1]


def test_a_body_in_pieces_is_hashed_whole(service: HostileService) -> None:
    body = json.dumps({"pad": "x" * 3000}).encode()
    want = hashlib.sha256(body).hexdigest()
    # two writes of a Content-Length body, a pause between them
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as s:
        s.sendall(_signed_head("/echo", body, f"Content-Length: {len(body)}\r\n"))
        s.sendall(body[:1000])
        time.sleep(0.2)
        s.sendall(body[1000:])
        status, out = _answer(s)
    assert status == 200 and json.loads(out)["body_sha256"] == want, out
    # chunked, three chunks with pauses
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as s:
        s.sendall(_signed_head("/echo", body, "Transfer-Encoding: chunked\r\n"))
        for piece in (body[:10], body[10:2000], body[2000:]):
            s.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            time.sleep(0.1)
        s.sendall(b"0\r\n\r\n")
        status, out = _answer(s)
    assert status == 200 and json.loads(out)["body_sha256"] == want, out
    # the control: a body that is not the signed one is still refused
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as s:
        s.sendall(_signed_head("/echo", body, f"Content-Length: {len(body)}\r\n"))
        s.sendall(body[:-1] + b" ")
        status, out = _answer(s)
    assert (status, json.loads(out)["code"]) == (400, "body_sha256_mismatch")


# --- 4. cheap to attack, cheap to serve -------------------------------------------------------

async def _while(attack_done: Any, url: str) -> tuple[list[float], float]:
    """Honest requests and /health while `attack_done()` is false: latencies, worst /health."""
    lat, worst = [], 0.0
    while not attack_done():
        lat += await honest_latencies(url, 5)
        worst = max(worst, await health_seconds(url))
    return lat, worst


@guarded(max_connections_per_ip=64, max_connections=400, header_timeout_s=1.5,
         rate_per_minute=100_000, rate_burst=10_000)
def test_slow_heads_and_idle_connections_are_closed(service: HostileService) -> None:
    url, port = service.url, service.port
    base = run(honest_latencies(url, 30))
    # 300 connections from one IP, each sending half a head and nothing more
    slow = []
    for _ in range(300):
        s = connect_from("127.0.0.2", port)
        s.sendall(b"POST /heartbeat HTTP/1.1\r\nHost: x\r\nx-addr")
        slow.append(s)
    # 1,100 idle connections: from one IP (its cap), and from 20 IPs (the total cap)
    idle = [connect_from("127.0.0.3", port) for _ in range(1100)]
    idle += [connect_from(f"127.0.1.{i % 20 + 1}", port) for i in range(1100)]
    peak = run(metrics(url))["connections"]
    assert peak <= 400, peak
    t0 = time.monotonic()
    during, worst = run(_while(lambda: time.monotonic() - t0 > 2.5, url))
    held = run(metrics(url))["connections"]
    assert held <= 400
    # every attacker's connection is closed: at once past a cap, else at the head deadline
    deadline = time.monotonic() + 3.0
    open_left = [s for s in slow + idle if not closed_by_server(s)]
    while open_left and time.monotonic() < deadline:
        open_left = [s for s in open_left if not closed_by_server(s, 0.05)]
    for s in slow + idle:
        s.close()
    assert not open_left, f"{len(open_left)} attacker connections still open"
    after = run(honest_latencies(url, 30))
    report = {"baseline_ms": median_ms(base), "during_ms": median_ms(during),
              "after_ms": median_ms(after), "health_worst_s": worst, "held_at_peak": peak,
              "held_after_2.5s": held, "dropped": run(dropped(url))}
    print("slow-heads", json.dumps(report))
    assert worst < 1.0, report
    assert median_ms(during) <= 2 * median_ms(base) + 5, report  # 5 ms: a shared machine's noise
    assert median_ms(after) <= 2 * median_ms(base) + 5, report


@guarded(body_idle_s=1.0, body_timeout_s=3.0)
def test_slow_bodies_are_cut_off(service: HostileService) -> None:
    port = service.port
    body = json.dumps({"pad": "x" * 200}).encode()
    # a body that stops: the connection is closed once it has been idle for body_idle_s
    stalled = connect_from("127.0.0.2", port)
    stalled.sendall(_signed_head("/echo", body, f"Content-Length: {len(body)}\r\n") + body[:20])
    # a body that trickles (never idle that long): 408 at body_timeout_s
    trickle = connect_from("127.0.0.2", port)
    trickle.sendall(_signed_head("/echo", body, f"Content-Length: {len(body)}\r\n"))
    t0 = time.monotonic()
    answer, closed_at = b"", None
    for i in range(len(body)):
        if time.monotonic() - t0 > 5:
            break
        try:
            trickle.sendall(body[i:i + 1])
        except OSError:
            break
        if closed_at is None and closed_by_server(stalled):
            closed_at = time.monotonic() - t0
        trickle.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            answer += trickle.recv(65536)
        if b"\r\n\r\n" in answer:
            break
    took = time.monotonic() - t0
    assert closed_at is not None and closed_at < 2.5, closed_at
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer[:200]
    assert 2.5 < took < 5.0, took
    # the control: an honest body sent at once is served
    assert run(honest_latencies(service.url, 3))


def _flood(url: str, n: int, out: Any) -> None:
    """`n` requests, each signed by a fresh key, from 127.0.0.4 (32 at a time)."""
    import secrets

    async def go() -> dict[str, int]:
        counts: dict[str, int] = {}
        conn = aiohttp.TCPConnector(local_addr=("127.0.0.4", 0), limit=32)
        async with aiohttp.ClientSession(connector=conn) as s:
            async def worker(k: int) -> None:
                for _ in range(k):  # signed just before it is sent: always fresh
                    h = sign_request("0x" + secrets.token_hex(32), "POST", "/heartbeat", HB,
                                     audience=AUD).as_dict()
                    try:
                        async with s.post(url + "/heartbeat", data=HB, headers=h) as r:
                            data = await r.read()
                            key = "ok" if r.status == 200 else json.loads(data)["code"]
                    except aiohttp.ClientError as e:
                        key = type(e).__name__
                    counts[key] = counts.get(key, 0) + 1
            await asyncio.gather(*(worker(n // 32) for _ in range(32)))
        return counts
    t0 = time.monotonic()
    counts = asyncio.run(go())
    out.put({**counts, "seconds": round(time.monotonic() - t0, 2)})


# a flood of 10,016 requests that asserts an honest key's latency during it: run alone
@pytest.mark.timing
@guarded(new_signer_burst=50, new_signers_per_minute=60, state_ttl_s=3.0, ip_burst=2000,
         ip_rate_per_minute=120_000, max_skew_s=5, rate_per_minute=100_000, rate_burst=10_000)
def test_fresh_keys_leave_bounded_state(service: HostileService) -> None:
    url = service.url
    base = run(honest_latencies(url, 30))
    proc, out = in_process(_flood, url, 10_016)  # 32 workers x 313
    during, worst = run(_while(lambda: not proc.is_alive() or not out.empty(), url))
    got = out.get(timeout=300)
    proc.join(10)
    sizes = run(metrics(url))
    rows = sqlite3.connect(service.db).execute("SELECT COUNT(*) FROM request_nonces").fetchone()
    # at most the newcomer budget got through: 50 at once, one a second after that
    allowed = 50 + got["seconds"] + 5
    report = {"flood": got, "sizes_after_flood": sizes, "nonce_rows": rows[0],
              "baseline_ms": median_ms(base), "during_ms": median_ms(during),
              "health_worst_s": worst}
    report["dropped"] = run(dropped(url))
    assert got.get("ok", 0) <= allowed and got["ip_rate_limited"] >= 10_016 - allowed, report
    honest = len(base) + len(during)  # the honest key's own nonces, kept as they should be
    assert sizes["signer_buckets"] <= allowed + 1, report
    assert sizes["nonces"] <= allowed + honest and rows[0] <= allowed + honest, report
    # idle state goes: after the ttl, one request evicts what the flood left
    time.sleep(max(3.0, 5 + 1) + 0.5)
    run(honest_latencies(url, 1))
    sizes = run(metrics(url))
    report["sizes_after_ttl"] = sizes
    print("fresh-keys", json.dumps(report))
    assert sizes["signer_buckets"] <= 1 and sizes["nonces"] <= 1, report
    assert sizes["ip_buckets"] <= 1 and sizes["newcomer_buckets"] <= 2, report
    assert worst < 1.0, report
    assert median_ms(during) <= 2 * median_ms(base) + 5, report


def test_unknown_codes_stay_typed() -> None:
    """The new refusals reach a client as their classes."""
    for code in (ErrorCode.WRONG_AUDIENCE, ErrorCode.IP_RATE_LIMITED,
                 ErrorCode.REQUEST_TIMEOUT):
        with pytest.raises(WireHTTPError) as e:
            raise_for(code.status, json.dumps({"error": "x", "code": code.value}).encode())
        assert type(e.value).CODE is code
