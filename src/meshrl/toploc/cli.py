"""`meshrl toploc ...`: calibrate TOPLOC thresholds on this hardware."""

from __future__ import annotations

from typing import Any

from meshrl.toploc.calibrate import CalibrateConfig

__all__ = ["register", "table_rows"]


def _calibrate(cfg: CalibrateConfig) -> int:
    import json

    from meshrl.toploc.calibrate import run_calibration

    report = run_calibration(cfg)
    for row in table_rows(report):
        print(json.dumps(row))
    print(json.dumps({"out": cfg.out, "calibrated_thresholds": report["calibrated_thresholds"],
                      "seconds": report["seconds"]}))
    return 0


def table_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per honest mode and per change: rejection rates under both threshold sets."""
    rows = []
    for kind in ("honest", "changes"):
        for name, r in report[kind].items():
            rows.append({
                "kind": kind, "name": name,
                "default_rollout_reject": r["default"]["rollout_reject"],
                "calibrated_rollout_reject": r["calibrated"]["rollout_reject"],
                "default_chunk_reject": round(r["default"]["chunk_reject"], 4),
                "calibrated_chunk_reject": round(r["calibrated"]["chunk_reject"], 4),
                "rollouts": r["default"]["rollouts"], "chunks": r["default"]["chunks"],
                "mant_err_mean_avg": round(r["mant_err_mean_avg"], 3),
                "exp_mismatches_max": r["exp_mismatches_max"],
            })
    return rows


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("toploc", help="verifiable-inference proofs")
    sub = group.add_subparsers(dest="toploc_command", metavar="ACTION", required=True)
    add_config_command(sub, "calibrate", CalibrateConfig, _calibrate,
                       "measure honest noise, derive thresholds, report detection of changes")
