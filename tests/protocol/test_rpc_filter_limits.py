"""The public RPC filter is no free computer (issue #41), against a real anvil and the real filter
on loopback: code-running calls get at most `max_gas` (set when absent), a flood of heavy batches
from one address leaves another's calls fast (fair queue per caller, bounded queue, deadlines),
half-sent heads cannot take its descriptors (the services' connection gate), log filters and node
powers are never forwarded; and what meshrl's own clients do through it still works."""

from __future__ import annotations

import asyncio
import http.client
import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from pydantic import ValidationError

from meshrl.protocol import Protocol, RpcBackend
from meshrl.protocol.anvil import _free_port
from meshrl.protocol.config import MAX_CALL_GAS, RpcFilterConfig
from meshrl.protocol.local import ANVIL_DEV_KEY
from meshrl.protocol.rpc_filter import (
    INVALID_PARAMS,
    CallerQueue,
    QueueFull,
    RpcFilter,
    caller_of,
    filter_in_thread,
)

pytestmark = pytest.mark.anvil  # most tests start anvil (tests/anvil_rule.py)

SRC = Path(__file__).resolve().parents[2] / "src"
ATTACKER = "127.0.0.3"  # another address of lo: the filter tells callers apart by IP
GASLEFT = "5a60005260206000f3"  # GAS PUSH1 0 MSTORE PUSH1 32 PUSH1 0 RETURN: the gas it got
LOOP = "5b600056"  # JUMPDEST PUSH1 0 JUMP: forever, until the gas runs out


def _deploy(backend, runtime_hex: str) -> str:
    """A contract whose code is `runtime_hex` (init code: copy it to memory, return it)."""
    rt = bytes.fromhex(runtime_hex)
    init = (bytes([0x60 + len(rt) - 1]) + rt + bytes.fromhex("600052")
            + bytes([0x60, len(rt), 0x60, 32 - len(rt), 0xF3]))
    r = backend.send(Account.from_key(ANVIL_DEV_KEY), {"data": "0x" + init.hex(), "gas": 100_000})
    assert backend.w3.eth.get_code(r["contractAddress"]).hex().removeprefix("0x") == runtime_hex
    return r["contractAddress"]


@pytest.fixture(scope="module")
def contracts(anvil_backend) -> dict[str, str]:
    return {"gasleft": _deploy(anvil_backend, GASLEFT), "loop": _deploy(anvil_backend, LOOP)}


@pytest.fixture
def serve(anvil_backend) -> Iterator:
    """`serve(**cfg)`: the filter in front of the test anvil, served from a thread."""
    stops = []

    def start(**kw) -> RpcFilter:
        f, stop = filter_in_thread(RpcFilterConfig(upstream=anvil_backend.url, port=0, **kw))
        stops.append(stop)
        return f

    yield start
    for stop in stops:
        stop()


def _post(url: str, body: object, source: str = "127.0.0.1",
          timeout: float = 30) -> tuple[int, object]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout,
                                      source_address=(source, 0))
    try:
        conn.request("POST", "/", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _call(method: str, params: list, id_: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


@pytest.mark.timing
@pytest.mark.anvil
def test_code_running_calls_get_at_most_max_gas(serve, contracts) -> None:
    """Before: a call with no gas ran with anvil's block gas limit (30 M), one with 2^40 with
    2^40 (an endless loop: about an hour of a core, long after the filter gave up)."""
    f = serve(max_gas=1_000_000)
    gasleft = contracts["gasleft"]
    for tx in ({"to": gasleft}, {"to": gasleft, "gas": hex(2**40)},
               {"to": gasleft, "gasLimit": hex(2**40)}):
        status, out = _post(f.url, _call("eth_call", [tx, "latest"]))
        got = int(out["result"], 16)
        assert status == 200 and 900_000 < got < 1_000_000, (tx, got)
    # a caller asking for less gets what it asked for
    _, out = _post(f.url, _call("eth_call", [{"to": gasleft, "gas": hex(100_000)}, "latest"]))
    assert 50_000 < int(out["result"], 16) < 100_000
    t = time.monotonic()
    _, out = _post(f.url, _call("eth_estimateGas", [{"to": contracts["loop"], "gas": hex(2**40)}]))
    assert "error" in out and time.monotonic() - t < 5
    for params in ([{"to": gasleft}, "latest", {gasleft: {"code": "0x" + LOOP}}],
                   [{"to": gasleft, "gas": "lots"}], ["0x00"], []):
        status, out = _post(f.url, _call("eth_call", params, 4))
        assert status == 200 and out["error"]["code"] == INVALID_PARAMS, params


@pytest.mark.anvil
def test_an_endless_loop_with_2_40_gas_costs_the_default_cap(serve, contracts) -> None:
    """With the default cap (10 M gas) an endless loop asked to run with 2^40 gas returns out of
    gas in milliseconds (~15 ms of anvil measured, docs/joining.md), not after the deadline."""
    f = serve()
    assert f.cfg.max_gas == MAX_CALL_GAS
    times = []
    for _ in range(3):
        t = time.monotonic()
        _, out = _post(f.url, _call("eth_call", [{"to": contracts["loop"], "gas": hex(2**40)},
                                                 "latest"]))
        times.append(time.monotonic() - t)
        assert "outofgas" in out["error"]["message"].lower().replace(" ", "")
    assert min(times) < 1.0, times


@pytest.mark.timing
@pytest.mark.anvil
def test_a_flood_of_heavy_batches_from_one_address_leaves_others_served(
        serve, contracts) -> None:
    """Six threads from one address post batches of 100 endless loops (2^40 gas each) for ~3 s.
    Before: the batches went to anvil whole, every loop ran to the block gas limit or beyond,
    and another address's calls were 140x slower, 2 of 10 failed. Now that address has at most
    2 calls at anvil (each capped), its queue is bounded (429 past it), and the other's calls,
    served round robin, stay fast and all succeed."""
    f = serve(timeout_s=5)
    loop_call = {"to": contracts["loop"], "gas": hex(2**40)}
    stop, statuses = threading.Event(), []

    def flood() -> None:
        while not stop.is_set():
            try:
                status, _ = _post(f.url, [_call("eth_call", [loop_call, "latest"], i)
                                          for i in range(100)], source=ATTACKER, timeout=15)
            except OSError:
                status = 0
            statuses.append(status)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the flood is on
    via, took = RpcBackend(f.url, timeout=10), []
    try:
        for _i in range(10):
            t = time.monotonic()
            out = via.w3.eth.call({"to": contracts["gasleft"]})
            assert 0 < int.from_bytes(out, "big") < MAX_CALL_GAS
            assert via.block_number() >= 0
            took.append(time.monotonic() - t)
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert statuses.count(429) > 0 and f.limited > 0  # the flood hit its queue bound
    assert max(took) < 2.0, took  # two calls each, behind at most two capped loops
    deadline = time.monotonic() + 10
    while f.queue.running and time.monotonic() < deadline:  # anvil's slots come back
        time.sleep(0.05)
    assert not f.queue.running and not f.queue.waiting


def test_the_queue_serves_callers_round_robin() -> None:
    """One caller with 50 calls queued: a second caller's call is the next one served."""
    async def main() -> list[str]:
        q, order = CallerQueue(slots=1, per_caller=1, max_waiting=60), []

        async def one(who: str) -> None:
            await q.acquire(who)
            order.append(who)
            await asyncio.sleep(0)
            q.release(who)

        flood = [asyncio.create_task(one("a")) for _ in range(50)]
        await asyncio.sleep(0)
        await one("b")
        await asyncio.gather(*flood)
        with pytest.raises(Exception, match="queued"):
            q.reserve("a", 61)
        return order

    order = asyncio.run(main())
    assert order.index("b") <= 2 and len(order) == 51


def test_the_queue_bound_is_strict_and_a_cancelled_wait_leaks_nothing() -> None:
    async def main() -> None:
        q = CallerQueue(slots=1, per_caller=1, max_waiting=2)
        await q.acquire("a")  # holds the only slot
        waits = [asyncio.create_task(q.acquire("a")) for _ in range(3)]
        await asyncio.sleep(0)
        assert isinstance(waits[2].exception(), QueueFull)  # 2 waiting already
        waits[0].cancel()  # a caller that went away gives its place up
        await asyncio.sleep(0)
        assert len(q.waiting["a"]) == 1
        q.release("a")
        await waits[1]  # the next one gets the slot, and gives it back
        q.release("a")
        assert q.free == 1 and not q.running and not q.waiting

    asyncio.run(main())


def test_callers_are_ips_and_ipv6_slash_64s() -> None:
    assert caller_of("198.51.100.7") == "198.51.100.7"
    assert caller_of("::ffff:198.51.100.7") == "198.51.100.7"
    assert caller_of("2001:db8:1:2:aaaa::1") == caller_of("2001:db8:1:2:bbbb::9")
    assert caller_of("2001:db8:1:2::1") != caller_of("2001:db8:1:3::1")


@pytest.mark.timing
@pytest.mark.anvil
def test_half_sent_heads_cannot_take_the_filters_descriptors(anvil_backend, tmp_path) -> None:
    """400 connections that send half a request head, against the filter process with 256
    descriptors. Before: a plain aiohttp site took them all and an honest call never got in.
    Now the connection gate keeps 64 per address, closes the oldest idle half-head to make way
    (and all of them after `header_timeout_s`), and descriptors never run out (asyncio's accept
    burst kept within the spare ones); the honest call from another address is answered."""
    ready, port, log = tmp_path / "ready", _free_port(), tmp_path / "stderr"

    def few_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "chain", "rpc-filter", "--upstream",
         anvil_backend.url, "--port", str(port), "--ready_file", str(ready),
         "--guard.header_timeout_s", "3"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, preexec_fn=few_fds,
        stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while not ready.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = ready.read_text()
        for _ in range(400):
            s = socket.socket()
            s.bind((ATTACKER, 0))
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", port))
                s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application")
            except OSError:
                pass
            socks.append(s)
        t = time.monotonic()
        assert RpcBackend(url, timeout=10).block_number() == anvil_backend.block_number()
        assert time.monotonic() - t < 5
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        assert health["connections"] <= 64 + 2  # the attacker's per-IP cap, and ours
        time.sleep(4)  # past the head deadline: every half-head is closed
        closed = 0
        for s in socks:
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == len(socks)
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        assert proc.wait(10) == 0
    assert "out of system resource" not in log.read_text()  # accept() never hit EMFILE


@pytest.mark.anvil
@pytest.mark.parametrize("method, params", [
    ("eth_newFilter", [{"fromBlock": "0x0"}]),
    ("eth_newBlockFilter", []),
    ("eth_newPendingTransactionFilter", []),
    ("eth_getFilterChanges", ["0x1"]),
    ("eth_uninstallFilter", ["0x1"]),
    ("eth_signTransaction", [{"from": Account.from_key(ANVIL_DEV_KEY).address}]),
    ("eth_signTypedData_v4", [Account.from_key(ANVIL_DEV_KEY).address, "{}"]),
    ("personal_sign", ["0x00", Account.from_key(ANVIL_DEV_KEY).address]),
    ("anvil_mine", []),
    ("anvil_setCode", ["0x" + "11" * 20, "0x00"]),
    ("evm_setNextBlockTimestamp", [1]),
    ("hardhat_setBalance", ["0x" + "11" * 20, "0xffff"]),
    ("debug_traceCall", [{"to": "0x" + "11" * 20}, "latest"]),
])
def test_log_filters_and_node_powers_are_refused(serve, anvil_backend, method, params) -> None:
    """Server-side log filters (20,000 were installed through the filter; meshrl reads logs
    with eth_getLogs) and anvil's signing, mining and cheat codes never reach anvil."""
    f = serve()
    block = anvil_backend.block_number()
    status, out = _post(f.url, [_call(method, params, i) for i in range(3)])
    assert status == 200 and all(o["error"]["code"] == -32601 for o in out)
    assert f.forwarded == 0 and f.refused == 3 and anvil_backend.block_number() == block


def test_a_config_cannot_allow_node_powers_or_log_filters() -> None:
    for method in ("anvil_setBalance", "eth_accounts", "eth_sendTransaction", "eth_sign",
                   "personal_unlockAccount", "evm_mine", "debug_traceTransaction",
                   "hardhat_impersonateAccount", "eth_newFilter"):
        with pytest.raises(ValidationError, match="never forwarded"):
            RpcFilterConfig(allow=["eth_chainId", method])
    assert "eth_newFilter" not in RpcFilterConfig().allow


@pytest.mark.anvil
def test_what_meshrl_clients_do_through_the_filter_still_works(serve, world) -> None:
    """A stranger with a little ether registers as a provider through the filter (gas
    estimates under the cap), reads 100 views in one batch, and sends ether."""
    if world.backend.name != "rpc":
        pytest.skip("the filter fronts anvil")
    f = serve()
    via = RpcBackend(f.url)
    poor = Account.create()
    world.backend.fund(poor.address, 10**15)  # 0.001 ether: less than 10 M gas at 1 gwei
    me = Protocol(via, world.fed.deployment, world.stranger.account)
    me.register_provider(200 * 10**18)
    me.add_node(world.n2, 2)
    assert me.provider().stake == 200 * 10**18 and me.node(world.n2.address).compute_units == 2
    token = via.w3.eth.contract(address=world.fed.token.address, abi=world.fed.token.abi)
    people = [world.p1.account.address, poor.address] * 50
    want = [world.fed.token.functions.balanceOf(a).call() for a in people]
    assert via.call_many([token.functions.balanceOf(a) for a in people]) == want
    to = Account.create().address
    via.send(poor, {"to": to, "value": 1})  # gas estimated through the filter
    assert world.backend.w3.eth.get_balance(to) == 1
    assert f.refused == 0 and f.limited == 0 and f.timed_out == 0
