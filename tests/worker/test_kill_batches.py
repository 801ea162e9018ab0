"""kill -9 of a worker at every phase of a batch's life (issue 46), then a restart: no file is
lost, every file is in exactly one batch, and no batch is submitted twice. Phases: formed (the
membership on disk, nothing sent), posted (the orchestrator has the leaves, the chain has
nothing), submitted on chain (not yet recorded). Real processes: anvil, discovery, an
orchestrator whose pool batches 2 files, and `meshrl worker` (the harness of test_kill.py)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from test_kill import _paused_at

from meshrl.protocol.batches import Batch, Leaf
from network import RULES, fund_provider, start_net, wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(1200)]

PHASES = ["batch-formed", "batch-posted", "batch-submitted-unrecorded"]


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    rules = {**RULES, "batch": {"files": 2, "max_delay_s": 60.0}}
    n = start_net(tmp_path_factory.mktemp("killb"), orch={"rules": rules})
    yield n
    n.close()


def _batches(net, node: str) -> list:
    return [e for e in net.fed.events(net.fed.deployment.block).poll()
            if e.name == "BatchSubmitted" and e.args["node"].lower() == node.lower()]


def test_kill9_at_every_batch_phase_loses_nothing_and_submits_once(net):
    _, node, _ = fund_provider(net, "crashb")
    work_dir = net.tmp / "w-crashb"
    for i, phase in enumerate(PHASES):
        w = worker(net, "crashb", max_files=2, crash_test_pause=120.0, crash_test_phase=phase)
        seen = w.log.read_text().count(f'"phase": "{phase}"') if w.log.exists() else 0
        w.start()
        wait_until(lambda w=w, s=seen, p=phase: _paused_at(w.log, p, s), 240)
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        again = worker(net, "crashb", max_files=2)
        again.start()
        assert again.wait(300) == 0, again.log.read_text()[-3000:]
        batches = _batches(net, node.address)
        assert len(batches) == i + 1 and all(b.args["count"] == 2 for b in batches), phase
        assert len({bytes(b.args["root"]) for b in batches}) == i + 1
    sent = [json.loads(x) for x in (work_dir / "outbox" / "sent.jsonl").read_text().splitlines()]
    assert len(sent) == len({r["sha256"] for r in sent}) == 2 * len(PHASES)
    # each file is in exactly one batch on chain: the sent records rebuild every root
    by_batch: dict[str, list[dict]] = {}
    for r in sent:
        by_batch.setdefault(r["batch_id"], []).append(r)
    roots = {}
    for bid, rows in by_batch.items():
        b = Batch.of([Leaf(node.address, bytes.fromhex(r["sha256"]), r["work_units"],
                           r["policy_version"], r["counter"]) for r in rows])
        assert b.id.hex() == bid
        roots[bid] = b.root
    assert sorted(roots.values()) == sorted(bytes(b.args["root"])
                                            for b in _batches(net, node.address))
    assert list((work_dir / "outbox").glob("*.json")) == []  # nothing left behind
    assert list((work_dir / "outbox" / "batches").glob("*.json")) == []
