"""Across hosts: a pool started by `meshrl network up --public_host ADDR` in one Linux network
namespace, a stranger's `meshrl worker join URL` with keystores in another. The namespaces share
no interface: the only way between them is a user-space link (tests/linkrelay.py: this kernel
has no netem) with 40 ms each way (80 ms round trip) and 20 Mbit/s per direction, which is cut
for 60 s mid-run. The stranger is funded from the operator's side, its files are accepted and
trained on, it outlives the cut without a restart (ejected, rejoined, nothing submitted twice),
and every check of the network's report passes.

Needs root and `ip netns` (CI runs as root); skipped with the reason elsewhere. Marked
`crosshost` (and `slow`): a whole training run, a few minutes on 2 cores."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import netutil as nu
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from linkrelay import Link

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.crosshost]

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CUT_S = 60.0
TOKEN = 10**18


def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to make network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip netns`"
    probe = f"mrlprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "`ip netns add` is not permitted here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Namespaces:
    """Two namespaces, each with loopback up and `addr` on it: the same address is the pool's
    in one and the link's listening end in the other."""

    def __init__(self, addr: str) -> None:
        tag = os.getpid()
        self.pool, self.worker, self.addr = f"mrl{tag}p", f"mrl{tag}w", addr
        for ns in (self.pool, self.worker):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/32", "dev", "lo")

    def path(self, ns: str) -> str:
        return f"/run/netns/{ns}"

    def close(self) -> None:
        for ns in (self.pool, self.worker):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(SRC)}
    e.pop("MESHRL_KEYSTORE_PASSWORD", None)
    return e


def _in(ns: str, *argv: str, log: Path | None = None, **kw) -> subprocess.Popen:
    out = log.open("ab") if log else subprocess.PIPE
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *argv], cwd=ROOT,
                            env=_env(), stdout=out,
                            stderr=subprocess.STDOUT if log else subprocess.PIPE, **kw)


def _ok(ns: str, *argv: str) -> dict:
    p = _in(ns, *argv)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


PROBE = """
import asyncio, json, sys
from pathlib import Path
from meshrl.wire import SignedClient
from meshrl.wire.models import LedgerPage
net = json.loads(Path(sys.argv[1]).read_text())
key = Path(net["trainer_key_file"]).read_text().strip()
async def go():
    async with SignedClient(net["orchestrator"], key) as c:
        page = await c.call("GET", "/ledger", response=LedgerPage,
                            query={"status": "accepted", "limit": 5000})
    return [e.sha256 for e in page.entries if e.node.lower() == sys.argv[2].lower()]
print(json.dumps(asyncio.run(go())))
"""


def _accepted(ns: Namespaces, root: Path, node: str) -> list[str]:
    p = _in(ns.pool, "-c", PROBE, str(root / "network.json"), node)
    out, _ = p.communicate(timeout=60)
    return json.loads(out) if p.returncode == 0 else []


def _lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


@pytest.fixture
def hosts():
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    addr = f"10.213.{os.getpid() % 250 + 1}.1"
    ns = Namespaces(addr)
    yield ns
    ns.close()


def test_a_stranger_on_another_host_joins_trains_and_outlives_a_cut(hosts, tmp_path) -> None:
    ns, addr = hosts, hosts.addr
    port = 23000 + (os.getpid() % 100) * 20
    cfg = tmp_path / "net.toml"
    cfg.write_text(nu.short_network(
        "xhost", steps=50, checkpoint_every=10, workers="honest = 1\ndishonest = 0",
        top=f'public_host = "{addr}"\nmax_minutes = 30\ndashboard = false\nrelays = 1'
    ).replace("{port}", str(port)))
    up_log = tmp_path / "up.log"
    up = _in(ns.pool, "-m", "meshrl.cli", "network", "up", str(ROOT / "configs" / "network.toml"),
             str(cfg), "--dir", str(tmp_path), log=up_log)
    root = tmp_path / "xhost"
    public = [port + off for off in (1, 2, 3, 4, 14)]  # discovery, orch, origin, relay, rpc
    link = Link([((addr, p), (addr, p)) for p in public], delay_s=0.04, rate_bps=20e6,
                listen_ns=ns.path(ns.worker), connect_ns=ns.path(ns.pool)).start()
    w: subprocess.Popen | None = None
    try:
        nu.wait(lambda: any(e["event"] == "start" and e.get("role") == "worker-0"
                            for e in nu.events(root)) or up.poll() is not None, 600,
                "the pool did not start", every=1.0)
        assert up.poll() is None, up_log.read_text()[-3000:]
        (tmp_path / "pw").write_text("far away\n")
        keys = _ok(ns.worker, "-m", "meshrl.cli", "keys", "new", "--dir", str(tmp_path / "k"),
                   "--password_file", str(tmp_path / "pw"), "--kdf_iterations", "2")
        provider, node = keys["provider"]["address"], keys["node"]["address"]
        wlog = tmp_path / "stranger.log"
        w = _in(ns.worker, "-m", "meshrl.cli", "worker", "join", f"http://{addr}:{port + 2}",
                "--keys.provider_keystore", keys["provider"]["keystore"],
                "--keys.node_keystore", keys["node"]["keystore"],
                "--keys.password_file", str(tmp_path / "pw"),
                "--work_dir", str(tmp_path / "stranger"), "--fund_poll_s", "0.5",
                "--poll_interval", "0.25", "--heartbeat_interval", "2.0",
                "--engine.num_threads", "1", log=wlog)
        nu.wait(lambda: any(x.startswith("fund on chain") for x in _lines(wlog))
                or w.poll() is not None, 180, "the stranger did not ask for funds")
        assert w.poll() is None, wlog.read_text()[-3000:]
        # the operator, on its own host: gas from the federator's key file, stake tokens minted
        op = ["--chain.rpc_url", f"http://127.0.0.1:{port}", "--chain.deployment",
              str(root / "chain" / "deployment.json"), "--chain.key_file",
              str(root / "keys" / "federator.key")]
        t_funded = time.monotonic()
        _ok(ns.pool, "-m", "meshrl.cli", "chain", "send", *op, "--to", provider, "--ether", "1")
        _ok(ns.pool, "-m", "meshrl.cli", "chain", "send", *op, "--to", node, "--ether", "0.1")
        _ok(ns.pool, "-m", "meshrl.cli", "chain", "mint", *op, "--to", provider, "--tokens",
            "200")
        nu.wait(lambda: _accepted(ns, root, node), 600, "no file of the stranger accepted",
                every=2.0)
        first_s = time.monotonic() - t_funded
        link.cut()
        time.sleep(CUT_S)
        assert w.poll() is None, wlog.read_text()[-3000:]  # alive through the cut
        before = set(_accepted(ns, root, node))
        link.restore()
        t_back = time.monotonic()
        nu.wait(lambda: set(_accepted(ns, root, node)) - before, 600,
                "no file accepted after the cut", every=2.0)
        back_s = time.monotonic() - t_back
        nu.wait(lambda: any(e["event"] == "finished" for e in nu.events(root)), 1500,
                "the trainer did not finish", every=3.0)
        assert w.poll() is None
        w.send_signal(signal.SIGTERM)  # the stranger leaves
        assert w.wait(120) == 0, wlog.read_text()[-3000:]
    finally:
        if w is not None and w.poll() is None:
            w.kill()
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # the report is written while the pool stops
            try:
                up.wait(180)
            except subprocess.TimeoutExpired:
                up.kill()
        link.close()
    used = [f for r in (json.loads(x) for x in (root / "trainer" / "rollouts.jsonl")
                        .read_text().splitlines() if x.strip()) for f in r["used"]]
    mine = [f for f in used if f["node"].lower() == node.lower()]
    print(json.dumps({"first_accepted_after_funding_s": round(first_s, 1),
                      "first_accepted_after_restore_s": round(back_s, 1),
                      "stranger_files_trained_on": len(mine), "link_bytes": link.bytes}))
    assert mine, "none of the stranger's files was trained on"
    report = json.loads((root / "report.json").read_text())
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert not failed, failed
    ev = [json.loads(x) for x in _lines(tmp_path / "stranger.log") if x.startswith("{")]
    assert sum(e.get("msg") == "pool" and "joined" in str(e.get("status")) for e in ev) >= 1
    sent = [json.loads(x) for x in (tmp_path / "stranger" / "outbox" / "sent.jsonl")
            .read_text().splitlines()]
    assert len({r["sha256"] for r in sent}) == len(sent)  # nothing delivered twice
