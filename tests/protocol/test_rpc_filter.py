"""The public RPC filter in front of a real anvil: standard calls and signed transactions pass,
anvil's and the node's own powers (anvil_*, evm_*, debug_*, eth_sendTransaction, ...) are
refused with a JSON-RPC error and never reach anvil; bodies and batches are bounded."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from eth_account import Account

from meshrl.protocol import RpcBackend
from meshrl.protocol.anvil import _free_port
from meshrl.protocol.config import RpcFilterConfig
from meshrl.protocol.local import ANVIL_DEV_KEY
from meshrl.protocol.rpc_filter import METHOD_NOT_FOUND, RpcFilter

pytestmark = pytest.mark.anvil
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def rpc_filter(anvil_backend):
    """The filter served from a thread of its own (its own event loop), on a free port."""
    f = RpcFilter(RpcFilterConfig(upstream=anvil_backend.url, port=0, max_body=4096,
                                  max_batch=5))
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(f.start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(10)
    yield f
    asyncio.run_coroutine_threadsafe(f.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


def _post(url: str, body: object | bytes) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _call(method: str, params: list, id_: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def test_standard_calls_and_signed_transactions_pass(rpc_filter, anvil_backend) -> None:
    via = RpcBackend(rpc_filter.url)
    assert via.chain_id == anvil_backend.chain_id
    sender = Account.from_key(ANVIL_DEV_KEY)
    to = Account.create().address
    via.send(sender, {"to": to, "value": 12345, "gas": 21_000})  # signed here, sent raw
    assert anvil_backend.w3.eth.get_balance(to) == 12345
    status, out = _post(rpc_filter.url, _call("net_version", []))
    assert status == 200 and out["result"] == str(anvil_backend.chain_id)


@pytest.mark.parametrize("method, params", [
    ("anvil_setBalance", ["0x" + "11" * 20, "0xffff"]),
    ("evm_increaseTime", [1000]),
    ("evm_mine", []),
    ("evm_snapshot", []),
    ("anvil_impersonateAccount", ["0x" + "11" * 20]),
    ("eth_sendTransaction", [{"from": Account.from_key(ANVIL_DEV_KEY).address,
                              "to": "0x" + "22" * 20, "value": "0x1"}]),
    ("eth_sendUnsignedTransaction", [{"from": "0x" + "11" * 20, "to": "0x" + "22" * 20}]),
    ("eth_sign", ["0x" + "11" * 20, "0x00"]),
    ("eth_accounts", []),
    ("debug_traceTransaction", ["0x" + "00" * 32]),
    ("hardhat_mine", []),
    ("personal_listAccounts", []),
    ("admin_nodeInfo", []),
    ("txpool_content", []),
])
def test_node_powers_are_refused(rpc_filter, anvil_backend, method, params) -> None:
    block, poor = anvil_backend.block_number(), "0x" + "11" * 20
    status, out = _post(rpc_filter.url, _call(method, params, 7))
    assert status == 200 and out["id"] == 7 and out["error"]["code"] == METHOD_NOT_FOUND
    assert method in out["error"]["message"]
    assert anvil_backend.block_number() == block  # nothing mined, no time moved
    assert anvil_backend.w3.eth.get_balance(poor) == 0


def test_batches_are_filtered_call_by_call_and_bounded(rpc_filter, anvil_backend) -> None:
    batch = [_call("eth_chainId", [], 1), _call("anvil_setBalance", ["0x" + "11" * 20, "0x1"], 2),
             _call("eth_blockNumber", [], 3)]
    status, out = _post(rpc_filter.url, batch)
    assert status == 200 and [o["id"] for o in out] == [1, 2, 3]
    assert int(out[0]["result"], 16) == anvil_backend.chain_id
    assert out[1]["error"]["code"] == METHOD_NOT_FOUND and "result" in out[2]
    status, out = _post(rpc_filter.url, [_call("eth_chainId", [], i) for i in range(6)])
    assert status == 400 and "batch longer than 5" in out["error"]["message"]
    status, out = _post(rpc_filter.url, b"x" * 5000)
    assert status == 413 and out["error"]["message"] == "body too large"
    status, out = _post(rpc_filter.url, b"{not json")
    assert status == 400 and out["error"]["code"] == -32700
    status, out = _post(rpc_filter.url, [])
    assert status == 400


def test_many_view_calls_through_the_filter_respect_its_batch_bound(rpc_filter, world) -> None:
    """`call_many` (the books, a worker's claims) through a filter that takes batches of at
    most 5: a batch it refuses (HTTP 400) is read one call at a time, same answers. Before,
    a worker behind the filter with over 100 items could never claim (the cross-host test)."""
    if world.backend.name != "rpc":
        pytest.skip("the filter fronts anvil")
    via = RpcBackend(rpc_filter.url)
    token = via.w3.eth.contract(address=world.fed.token.address, abi=world.fed.token.abi)
    people = [world.p1.address, world.p2.address, world.stranger.address] * 4
    want = [world.fed.token.functions.balanceOf(a).call() for a in people]
    assert via.call_many([token.functions.balanceOf(a) for a in people], chunk=5) == want
    assert via.call_many([token.functions.balanceOf(a) for a in people]) == want  # 12 > 5


def test_rpc_filter_command_serves_on_the_given_address(anvil_backend, tmp_path) -> None:
    ready, port = tmp_path / "ready", _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "chain", "rpc-filter", "--upstream",
         anvil_backend.url, "--port", str(port), "--ready_file", str(ready)],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # a loaded machine takes its time to start it
        while not ready.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = ready.read_text()
        assert url == f"http://127.0.0.1:{port}"
        assert _post(url, _call("evm_mine", []))[1]["error"]["code"] == METHOD_NOT_FOUND
        assert RpcBackend(url).chain_id == anvil_backend.chain_id
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_chain_node_public_host_serves_only_the_filter(tmp_path) -> None:
    """`meshrl chain node --public_host ADDR`: anvil stays on 127.0.0.1; ADDR serves the public
    RPC through the filter only: eth_* and signed transactions pass, anvil_* / evm_* do not
    (and never reach anvil); SIGTERM stops both."""
    port, public_port, host = _free_port(), _free_port(), "127.0.0.2"  # another address of lo
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "chain", "node", "--port", str(port),
         "--public_host", host, "--public_port", str(public_port),
         "--chain.deployment", str(tmp_path / "dep.json")],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
        out = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        public, private = out["public_rpc_url"], out["url"]
        assert public == f"http://{host}:{public_port}"
        assert private == f"http://127.0.0.1:{port}"
        with pytest.raises(urllib.error.URLError):  # anvil is not on the public address
            _post(f"http://{host}:{port}", _call("eth_chainId", []))
        anvil, via = RpcBackend(private), RpcBackend(public)
        assert via.chain_id == anvil.chain_id == 31337
        block = anvil.block_number()
        assert _post(public, _call("eth_blockNumber", []))[1]["result"] == hex(block)
        for method, params in [("anvil_setBalance", ["0x" + "11" * 20, "0xffff"]),
                               ("evm_increaseTime", [1000]), ("evm_mine", []),
                               ("anvil_impersonateAccount", ["0x" + "11" * 20])]:
            status, got = _post(public, _call(method, params, 3))
            assert status == 200 and got["error"]["code"] == METHOD_NOT_FOUND, (method, got)
        assert anvil.block_number() == block and anvil.w3.eth.get_balance("0x" + "11" * 20) == 0
        to = Account.create().address
        via.send(Account.from_key(ANVIL_DEV_KEY), {"to": to, "value": 777, "gas": 21_000})
        assert anvil.w3.eth.get_balance(to) == 777  # a signed transaction goes through
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        for url in (public, private):
            with pytest.raises(urllib.error.URLError):
                _post(url, _call("eth_chainId", []))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
