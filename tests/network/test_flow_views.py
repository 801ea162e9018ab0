"""The flow of a run as the report and the dashboard show it, on hand-built records: the
trainer's idle share, the validator's lag, the stale drops, the pool's pacing and why the
trainer or the pool waits, each from what its role wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshrl.dashboard.state import WAIT_FRESH_S, flow_state
from meshrl.network.report import _flow, _flow_markdown


def _step(step: int, seconds: float, wait: float, lag: int | None, load: float = 0.0
          ) -> dict[str, Any]:
    out = {"kind": "step", "step": step, "step_seconds": seconds, "wait_seconds": wait,
           "train_seconds": seconds - wait, "load_seconds": load}
    return out if lag is None else {**out, "validator_lag": lag}


def _ref(i: int) -> dict[str, Any]:
    return {"sha256": f"{i:064x}", "node": "0xaa", "version": 0}


def test_flow_counts_idle_lag_and_stale_drops() -> None:
    metrics = [{"kind": "eval", "step": 0}, _step(1, 2.0, 1.5, 4, load=0.5),
               _step(2, 1.0, 0.5, 2), _step(3, 1.0, 0.0, None)]  # a step from before the lag
    records = [{"step": 0, "used": [_ref(1), _ref(2)], "dropped": [{**_ref(3),
                                                                    "reason": "stale"}]},
               {"step": 1, "used": [_ref(4)], "dropped": [{**_ref(5), "reason": "unusable: x"}]},
               {"step": 2, "used": [_ref(6), _ref(7), _ref(8)], "dropped": []}]
    ledger = [{"granted": True}] * 9 + [{"granted": False}]
    f = _flow(metrics, records, ledger)
    assert f["steps"] == 3 and f["step_seconds"] == 4.0
    assert f["idle_share"] == 0.5 and f["load_share"] == 0.125  # 2 s of 4 waiting, 0.5 reading
    assert (f["validator_lag_mean"], f["validator_lag_max"]) == (3.0, 4)
    assert (f["files_taken"], f["files_used"], f["stale_dropped"]) == (8, 6, 1)
    assert f["stale_share"] == 0.125 and f["files_granted"] == 9
    md = "\n".join(_flow_markdown(f))
    assert "- trainer idle: 50.0% of 4.0 s of steps (reading files: 12.5%" in md
    assert "mean 3.0, max 4" in md and "dropped as stale 1 (12.5%)" in md


def test_flow_of_a_run_without_steps() -> None:
    f = _flow([], [], [])
    assert f["idle_share"] is None and f["stale_share"] is None
    assert f["validator_lag_max"] is None
    assert "trainer idle: n/a" in "\n".join(_flow_markdown(f))


def _log(path: Path, *records: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not json\n" + "".join(json.dumps(r) + "\n" for r in records))


def test_dashboard_flow_shows_the_last_step_and_fresh_waits(tmp_path: Path) -> None:
    now = 1000.0
    _log(tmp_path / "logs" / "trainer.log",
         {"ts": now - 5, "msg": "step waiting for accepted files", "why": "12 more groups"},
         {"ts": now - 2, "msg": "published", "version": 9})
    _log(tmp_path / "logs" / "orchestrator.log",
         {"ts": now - WAIT_FRESH_S - 1, "msg": "pool step waiting", "why": "long ago"})
    steps = [{"kind": "step", "step": 8, "idle_share": 0.7},
             {"kind": "step", "step": 9, "idle_share": 0.25, "validator_lag": 3,
              "dropped_stale": 1}]
    pacing = {"ahead": 8, "taken_through": 40, "backlog": 6, "leases": 2}
    f = flow_state(tmp_path, steps, pacing, now)
    assert (f["idle_share"], f["validator_lag"], f["dropped_stale"]) == (0.25, 3, 1)
    assert f["pacing"] == pacing
    # the trainer's wait is fresh, the pool's is over (each is repeated while it lasts)
    assert [(w["role"], w["why"]) for w in f["waiting"]] == [("trainer", "12 more groups")]
    empty = flow_state(tmp_path / "nothing", [], None, now)
    assert empty == {"idle_share": None, "validator_lag": None, "dropped_stale": None,
                     "pacing": None, "waiting": []}


def test_dashboard_page_has_the_flow_line() -> None:
    from meshrl.dashboard.app import PAGE

    assert '<p id="flow">' in PAGE and '<ul id="waiting">' in PAGE
    assert "s.flow" in PAGE and "validator lag" in PAGE
