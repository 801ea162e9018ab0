"""`meshrl toploc ...`: calibrate TOPLOC thresholds on this hardware."""

from __future__ import annotations

from typing import Any

from meshrl.toploc.calibrate import CalibrateConfig

__all__ = ["register"]


def _calibrate(cfg: CalibrateConfig) -> int:
    import json

    from meshrl.toploc.calibrate import run_calibration

    report = run_calibration(cfg)
    print(json.dumps({"out": cfg.out, "calibrated_thresholds": report["calibrated_thresholds"],
                      "seconds": report["seconds"]}))
    return 0


def register(subparsers: Any) -> None:
    from meshrl.cli import add_config_command

    group = subparsers.add_parser("toploc", help="verifiable-inference proofs")
    sub = group.add_subparsers(dest="toploc_command", metavar="ACTION", required=True)
    add_config_command(sub, "calibrate", CalibrateConfig, _calibrate,
                       "measure honest noise, derive thresholds, report detection of changes")
