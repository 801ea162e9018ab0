"""The report's flow section on hand-built trainer records: the trainer's idle share, the
validator's lag and the stale drops, counted from what the trainer wrote."""

from __future__ import annotations

from typing import Any

from meshrl.network.report import _flow, _flow_markdown


def _step(step: int, seconds: float, wait: float, lag: int | None, load: float = 0.0
          ) -> dict[str, Any]:
    out = {"kind": "step", "step": step, "step_seconds": seconds, "wait_seconds": wait,
           "train_seconds": seconds - wait, "load_seconds": load}
    return out if lag is None else {**out, "validator_lag": lag}


def _ref(i: int) -> dict[str, Any]:
    return {"sha256": f"{i:064x}", "node": "0xaa", "step": 0, "version": 0}


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
