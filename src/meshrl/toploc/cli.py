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
    print(json.dumps({"out": cfg.out, "fitted_thresholds": report["thresholds"]["fitted"],
                      "seconds": report["seconds"]}))
    return 0


def table_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row for the honest chunks (all, held out) and one per change: rejection rates under
    the default, fitted and paper thresholds, and the honest rows' largest value / threshold."""
    rows = []
    named = [("honest", "all", report["honest_all"]),
             ("honest", "held_out", report["honest_held_out"])]
    named += [("change", name, r) for name, r in report["changes"].items()]
    for kind, name, r in named:
        row: dict[str, Any] = {"kind": kind, "name": name, "rollouts": r["default"]["rollouts"],
                               "chunks": r["default"]["chunks"]}
        for th in ("default", "fitted", "paper"):
            row[f"{th}_rollout_reject"] = round(r[th]["rollout_reject"], 4)
            row[f"{th}_chunk_reject"] = round(r[th]["chunk_reject"], 4)
        if kind == "honest":
            row["default_max_ratio"] = max(r["default"]["max_ratio"].values())
        rows.append(row)
    return rows


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("toploc", help="verifiable-inference proofs")
    sub = group.add_subparsers(dest="toploc_command", metavar="ACTION", required=True)
    add_config_command(sub, "calibrate", CalibrateConfig, _calibrate,
                       "measure honest noise, derive thresholds, report detection of changes")
