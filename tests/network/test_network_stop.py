"""Ctrl-C of `meshrl network up` ends the network within 15 s in any phase, no role killed:
SIGINT to the process group (as a terminal sends it) while the chain is set up, during the
trainer's warm start (the workers waiting for their first policy), during RL (a worker
mid-file, the validator judging) and while the report of a finished run is written. Real
processes: anvil, every service, trainer, validator, worker; the smallest network of
benchmarks/bench_network_stop.py, which times each phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_network_stop import events, measure

# `timing`: it asserts a wall-clock bound, so it runs after the parallel part, alone
pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timing, pytest.mark.timeout(900)]


@pytest.mark.parametrize("phase", ["chain", "warm", "rl", "report"])
def test_ctrl_c_stops_the_network_within_15_s_in_any_phase(phase: str, tmp_path) -> None:
    port = 24000 + (hash(str(tmp_path)) % 100) * 40
    out = measure(phase, tmp_path, port)
    log = (tmp_path / "up.log").read_text()[-3000:]
    assert out["rc"] == 0, log
    assert out["stop_s"] < 15, out
    assert not out["killed"], out  # every role ended on SIGTERM
    stopped = next(e for e in events(tmp_path / "stop") if e["event"] == "network stopped")
    want = "trained" if phase == "report" else "interrupted"
    assert stopped["stop_s"] < 15 and stopped["outcome"] == want, stopped
    if phase == "warm":  # the trainer saved its warm start's progress on the way out
        assert out["stopped"]["trainer"] == 130, out
        saved = tmp_path / "stop" / "trainer" / "warm_start" / "progress.json"
        assert json.loads(saved.read_text())["done"] is False
    if phase == "rl":  # every role that was up ended by itself
        assert {"worker-0", "validator", "trainer", "orchestrator", "anvil"} <= set(out["stopped"])
