"""kill -9 of a worker at every phase of a file's life, then a restart: no finished file is lost
and none is submitted twice. Phases: generated (in memory only), written to the outbox, upload
slot granted (upload not done), uploaded (not submitted), submitted on chain (not yet recorded).
Real processes: anvil, discovery, orchestrator and `meshrl worker`."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from network import fund_provider, start_net, wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

PHASES = ["generated", "written", "slot-granted", "uploaded", "submitted-unrecorded"]


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    n = start_net(tmp_path_factory.mktemp("kill"))
    yield n
    n.close()


def _paused_at(log: Path, phase: str, seen: int) -> bool:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    hits = [x for x in lines if x.get("msg") == "crash-test pause" and x["phase"] == phase]
    return len(hits) > seen


def _submissions(net, node: str) -> list[str]:
    return [bytes(e.args["file_sha256"]).hex() for e in net.fed.events(
        net.fed.deployment.block).poll() if e.name == "WorkSubmitted" and
        e.args["node"].lower() == node.lower()]


def test_kill9_at_every_phase_loses_nothing_and_submits_once(net):
    _, node, _ = fund_provider(net, "crash")
    work_dir = net.tmp / "w-crash"
    for i, phase in enumerate(PHASES):
        # held at this phase only (120 s: it is killed there), the earlier ones run at speed
        w = worker(net, "crash", max_files=1, crash_test_pause=120.0, crash_test_phase=phase)
        seen = w.log.read_text().count(f'"phase": "{phase}"') if w.log.exists() else 0
        w.start()
        wait_until(lambda w=w, s=seen, p=phase: _paused_at(w.log, p, s), 240)
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait()
        again = worker(net, "crash", max_files=1)
        again.start()
        assert again.wait(300) == 0, again.log.read_text()[-3000:]
        subs = _submissions(net, node.address)
        assert len(subs) == len(set(subs)) == i + 1, (phase, subs)
    sent = [json.loads(x) for x in (work_dir / "outbox" / "sent.jsonl").read_text().splitlines()]
    assert sorted({r["sha256"] for r in sent}) == sorted(_submissions(net, node.address))
    assert list((work_dir / "outbox").glob("*.json")) == []  # nothing left behind
    # the file killed in memory was regenerated under a fresh counter, never reused
    assert len({r["counter"] for r in sent}) == len(PHASES)
