"""A stranger joins with two commands: `meshrl keys new`, then `meshrl worker join URL`. Real
processes on loopback: anvil behind the public RPC filter, discovery, orchestrator, a validator,
and the stranger's worker, which has no deployment file, no dev keys and only the URL. It
prints what to fund, waits, and once the operator sent gas and tokens (`meshrl chain send`
through the filter) stakes, joins and gets its files accepted. A clock 400 s off is refused at
start in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
import itertools

from meshrl.network.keys import write_key_file
from meshrl.protocol import Deployment
from meshrl.protocol.anvil import _free_port
from network import TOKEN, key, start_net, validator, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anvil]
SRC = Path(__file__).resolve().parents[2] / "src"


def _meshrl(*args: str, env: dict | None = None, log: Path | None = None,
            pythonpath: str = str(SRC)) -> subprocess.Popen:
    e = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    e.pop("MESHRL_KEYSTORE_PASSWORD", None)
    out = log.open("ab") if log else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "meshrl.cli", *args], env=e,
                            stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE)


def _ok(*args: str) -> dict:
    p = _meshrl(*args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("join")
    port = _free_port()
    rpc = f"http://127.0.0.1:{port}"
    n = start_net(tmp, orch={"join": {"rpc_url": rpc, "trainer": key("trainer").address}})
    filt = _meshrl("chain", "rpc-filter", "--upstream", n.anvil.url, "--port", str(port),
                   "--ready_file", str(tmp / "rpc.ready"))
    wait_until(lambda: (tmp / "rpc.ready").is_file(), 30)
    n.rpc = rpc
    yield n
    filt.terminate()
    filt.wait(10)
    n.close()


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_stranger_joins_with_two_commands_and_gets_files_accepted(net) -> None:
    tmp = net.tmp
    (tmp / "pw").write_text("stranger's secret\n")
    keys = _ok("keys", "new", "--dir", str(tmp / "skeys"), "--password_file", str(tmp / "pw"),
               "--kdf_iterations", "2")
    provider, node = keys["provider"]["address"], keys["node"]["address"]
    work = tmp / "stranger"
    log = tmp / "stranger.log"
    w = _meshrl("worker", "join", net.orch.url, "--chain.rpc_url", net.rpc,
                "--keys.provider_keystore", keys["provider"]["keystore"],
                "--keys.node_keystore", keys["node"]["keystore"],
                "--keys.password_file", str(tmp / "pw"), "--work_dir", str(work),
                "--model_dir", str(net.model_dir), "--max_files", "2", "--poll_interval", "0.3",
                "--heartbeat_interval", "1.0", "--fund_poll_s", "0.3",
                "--engine.num_threads", "1", log=log)
    try:
        fund = wait_until(lambda: [x for x in _lines(log) if x.startswith("fund on chain")], 120)
        assert provider in fund[0] and node in fund[0] and net.rpc in fund[0]
        assert w.poll() is None  # waiting, nothing staked yet
        assert net.fed.provider(provider).stake == 0
        # the operator funds it from its own machine, through the public RPC, key from a file
        fed_key = write_key_file(key("fed"), tmp / "fed.key")
        net.fed.mint(key("fed").address, 1000 * TOKEN)
        t_funded = time.monotonic()
        op = ["--chain.rpc_url", net.rpc, "--chain.deployment", str(net.deployment),
              "--chain.key_file", str(fed_key)]
        _ok("chain", "send", *op, "--to", provider, "--ether", "1", "--tokens", "200")
        _ok("chain", "send", *op, "--to", node, "--ether", "0.1")
        v = validator(net)
        v.start()
        first = wait_until(lambda: _accepted(net, node), 300, every=0.5)
        t_first = time.monotonic() - t_funded
        assert w.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if w.poll() is None:
            w.kill()
    print(json.dumps({"first_accepted_after_funding_s": round(t_first, 1)}))
    assert first and net.fed.provider(provider).stake >= 100 * TOKEN
    assert net.fed.node(node).pool == net.pool
    # what it staked on was the pool's deployment, learnt from the manifest, not a local file
    assert Deployment.load(work / "deployment.json").protocol == net.fed.deployment.protocol
    said = [x for x in _lines(log) if x.startswith("fund on chain")]
    # once, and again only when what is missing changed (each line names less)
    assert said[0] == fund[0] and len(said) <= 3
    assert all(len(b) < len(a) for a, b in itertools.pairwise(said))


def _accepted(net, node: str) -> list[str]:
    import asyncio

    from meshrl.wire import SignedClient
    from meshrl.wire.models import LedgerPage
    from network import key as k

    async def read() -> LedgerPage:
        async with SignedClient(net.orch.url, "0x" + bytes(k("mgr").key).hex()) as c:
            return await c.call("GET", "/ledger", response=LedgerPage,
                                query={"status": "accepted", "limit": 1000})
    return [e.sha256 for e in asyncio.run(read()).entries if e.node.lower() == node.lower()]


def test_a_clock_400_s_off_is_refused_at_start_in_one_line(net) -> None:
    shim = net.tmp / "clock-shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(
        "import time\n_real = time.time\ntime.time = lambda: _real() + 400\n")
    t0 = time.monotonic()
    p = _meshrl("worker", "join", net.orch.url, "--work_dir", str(net.tmp / "skewed"),
                "--keys.password_file", str(net.tmp / "nope"),
                pythonpath=f"{shim}{os.pathsep}{SRC}")
    _, err = p.communicate(timeout=120)
    lines = [x for x in err.decode().splitlines() if x.strip() and not x.startswith("{")]
    assert p.returncode == 1 and len(lines) == 1, err.decode()
    assert "+400 s" not in lines[0] and "-400 s off" in lines[0] and "300 s" in lines[0]
    assert time.monotonic() - t0 < 60
