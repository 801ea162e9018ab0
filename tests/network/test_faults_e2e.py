"""Fault injection end to end: a shortened network where the supervisor kills -9 a worker, a
relay, the validator, the trainer and the orchestrator mid-run. Each is restarted and
recovers, the run completes, no accepted rollout is used twice, no honest node is ejected and no
work is judged twice on chain.

The tests run in any order: after the last one, the fixture stops the network with Ctrl-C and
`_faults_are_reported_with_detect_and_recover_times` checks the reports it writes (a failure
there is an error at the teardown of the module's last test)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import netutil as nu
import pytest

from meshrl.rl.network_source import read_records

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

STEPS = 36
# the trainer is killed early: on an idle machine it finishes its steps in ~35 s, and a role
# that has finished is not restarted (nothing to recover)
KILLS = [("worker-1", 8), ("trainer", 12), ("relay-0", 16), ("validator", 20),
         ("orchestrator", 26)]
CONFIG = nu.short_network("faults", steps=STEPS, checkpoint_every=3,
                          top='faults = "{faults}"', workers="honest = 2\ndishonest = 0")


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    plan = tmp / "faults.toml"
    plan.write_text("settle_s = 5.0\n" + "".join(
        f'[[kill]]\nrole = "{r}"\nat_s = {t}\n' for r, t in KILLS))
    config = CONFIG.replace("{faults}", str(plan))
    run = nu.run_network(tmp, config, "faults", port_offset=20)
    root, proc = next(run)
    try:  # the trainer finished; wait until every killed role is back too
        nu.wait(lambda: len([e for e in nu.events(root) if e["event"] == "recovered"])
                >= len(KILLS), 180, "not every killed role recovered")
        yield root, proc
        _faults_are_reported_with_detect_and_recover_times(root, proc)
    finally:
        run.close()


def test_every_killed_role_recovers_and_the_run_completes(net) -> None:
    root, _ = net
    ev = nu.events(root)
    for role, _ in KILLS:
        assert any(e["event"] == "killed" and e["role"] == role for e in ev), role
        assert any(e["event"] == "recovered" and e["role"] == role for e in ev), role
    metrics = [json.loads(x) for x in (root / "trainer" / "metrics.jsonl").read_text()
               .splitlines()]
    assert max(m["step"] for m in metrics if m["kind"] == "step") == STEPS
    # the killed trainer started again: from its checkpoint, or warm-started again when it died
    # before its first one (a deterministic warm-start: the same version 0); killed during its
    # first warm-start (a loaded machine), only the second session's warm-start is recorded
    assert [e["role"] for e in ev if e["event"] == "start"].count("trainer") == 2
    starts = [m["kind"] for m in metrics if m["kind"] in ("resume", "warm_start")]
    assert starts in (["warm_start", "resume"], ["warm_start", "warm_start"], ["warm_start"])


def test_nothing_used_twice_nothing_judged_twice_nobody_ejected(net) -> None:
    root, _ = net
    records = read_records(root / "trainer" / "rollouts.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    seen = [f["sha256"] for r in records for f in [*r["used"], *r["dropped"]]]
    assert len(seen) == len(set(seen))
    ledger = nu.ledger(root)
    for r in records:
        for f in r["used"]:
            assert ledger[f["sha256"]].status.value == "accepted"
    evs = nu.chain(root).events().poll()
    judged = [bytes(e.args["work_id"]) for e in evs if e.name == "WorkInvalidated"]
    assert len(judged) == len(set(judged))
    assert not [e for e in evs if e.name == "NodeEjected"]
    assert not [e for e in evs if e.name == "WorkInvalidated" and e.args["hard"]]


def _faults_are_reported_with_detect_and_recover_times(root: Path,
                                                      proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(180) == 0
    faults = json.loads((root / "faults.json").read_text())
    assert [f["role"] for f in faults] == [r for r, _ in KILLS]
    for f in faults:
        assert 0 < f["detect_s"] <= f["recover_s"] < 120, f
    rep = json.loads((root / "report.json").read_text())
    assert [f["role"] for f in rep["faults"]] == [r for r, _ in KILLS]
    assert not [c for c in rep["checks"] if not c["ok"]], rep["checks"]
