"""A joined worker outlives a 30 s cut of its link: everything it reaches (the orchestrator,
discovery and the chain's public RPC) goes through a user-space link that is cut for 30 s. The
pool ejects it meanwhile (3 missed 1 s heartbeats); when the link is back the same process
rejoins, goes on delivering, and nothing is lost or submitted twice.

30 s is 6x every request timeout here (5 s) and 10x the ejection budget (3 s); by then each
of the worker's loops has timed out and backed off (doubling from 1 s) several times over. The
cross-host test cuts for 60 s with the pool's real timeouts (tests/network/test_cross_host.py)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
import contextlib

from test_join import _accepted, _meshrl, _ok

from linkrelay import Link
from meshrl.protocol.anvil import _free_port
from network import TOKEN, start_net, validator, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.anvil]
CUT_S = 30.0


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _events(log: Path) -> list[dict]:
    out = []
    for x in log.read_text().splitlines():
        if x.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(x))
    return out


def _submissions(net, node: str) -> list[str]:
    return [bytes(e.args["file_sha256"]).hex() for e in net.fed.events(
        net.fed.deployment.block).poll() if e.name == "WorkSubmitted" and
        e.args["node"].lower() == node.lower()]


def test_a_30_s_link_cut_is_outlived_without_a_restart(tmp_path) -> None:
    filt_port, rpc_l, disc_l, orch_l = (_free_port() for _ in range(4))
    local = "127.0.0.1"
    net = start_net(tmp_path, orch={"heartbeat": {"interval_s": 1.0, "dead_after": 3},
                                    "join": {"rpc_url": f"http://{local}:{rpc_l}",
                                             "discovery_url": f"http://{local}:{disc_l}"}})
    filt = _meshrl("chain", "rpc-filter", "--upstream", net.anvil.url, "--port",
                   str(filt_port), "--ready_file", str(tmp_path / "rpc.ready"))
    link = Link([((local, rpc_l), (local, filt_port)),
                 ((local, disc_l), (local, _port(net.disc.url))),
                 ((local, orch_l), (local, _port(net.orch.url)))], delay_s=0.04).start()
    w = None
    try:
        wait_until(lambda: (tmp_path / "rpc.ready").is_file(), 30)
        (tmp_path / "pw").write_text("pw")
        keys = _ok("keys", "new", "--dir", str(tmp_path / "k"), "--password_file",
                   str(tmp_path / "pw"), "--kdf_iterations", "2")
        provider, node = keys["provider"]["address"], keys["node"]["address"]
        net.fed.backend.fund(provider, 10**19)
        net.fed.backend.fund(node, 10**19)
        net.fed.mint(provider, 200 * TOKEN)
        log = tmp_path / "w.log"
        w = _meshrl("worker", "join", f"http://{local}:{orch_l}",
                    "--chain.rpc_url", f"http://{local}:{rpc_l}",
                    "--keys.provider_keystore", keys["provider"]["keystore"],
                    "--keys.node_keystore", keys["node"]["keystore"],
                    "--keys.password_file", str(tmp_path / "pw"),
                    "--work_dir", str(tmp_path / "w"), "--model_dir", str(net.model_dir),
                    "--poll_interval", "0.3", "--heartbeat_interval", "1.0",
                    "--http_timeout_s", "5", "--chain.rpc_timeout_s", "5",
                    "--engine.num_threads", "1", log=log)
        v = validator(net)
        v.start()
        wait_until(lambda: _accepted(net, node), 300, every=0.5)
        link.cut()
        t_cut = time.monotonic()
        wait_until(lambda: net.fed.node(node).pool == 0, 30)  # ejected by the pool
        time.sleep(max(0.0, CUT_S - (time.monotonic() - t_cut)))
        assert w.poll() is None, log.read_text()[-3000:]  # alive through the cut
        before = set(_accepted(net, node))
        link.restore()
        wait_until(lambda: net.fed.node(node).pool == net.pool, 120)  # rejoined by itself
        wait_until(lambda: set(_accepted(net, node)) - before, 240, every=0.5)
        assert w.poll() is None
        w.send_signal(signal.SIGTERM)
        assert w.wait(120) == 0, log.read_text()[-3000:]
        subs = _submissions(net, node)
    finally:
        if w is not None and w.poll() is None:
            w.kill()
        link.close()
        filt.terminate()
        filt.wait(10)
        net.close()
    ev = _events(log)
    joined = [e for e in ev if e.get("msg") == "pool" and "joined" in str(e.get("status"))]
    assert len(joined) == 2, joined  # once at start, once after the ejection
    assert any(e.get("msg") in ("retrying", "delivery postponed", "heartbeat failed",
                                "no work order yet") for e in ev)
    sent = [json.loads(x) for x in (tmp_path / "w" / "outbox" / "sent.jsonl")
            .read_text().splitlines()]
    assert len(subs) == len(set(subs))  # nothing submitted twice
    assert {r["sha256"] for r in sent} <= set(subs)  # every delivered file is on chain
