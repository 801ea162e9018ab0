"""The path of a policy version through a finished `meshrl network up` run, stage by stage.

For every file the trainer used: its version published (the trainer's `published`), loaded by
the worker that made the file (`policy loaded`), the file written (`file written`), its first
verdict (`verdict` of a validator), and the trainer's step that used it (`rollouts.jsonl`).
One JSON line per stage with the 10th / 50th / 90th percentile in seconds; the last line says
how many steps after its version a file was used.

    python benchmarks/demo_path.py runs/network      # the run directory of `make demo`
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _events(path: Path, msg: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue  # progress bars and other non-JSON lines
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("msg") == msg:
            out.append(rec)
    return out


def _quantiles(values: list[float]) -> dict[str, float | int]:
    v = sorted(values)
    pick = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], 3)  # noqa: E731
    return {"files": len(v), "p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9)}


def stages(run: Path) -> dict[str, list[float]]:
    logs = run / "logs"
    published = {r["version"]: r["t"] for r in _events(logs / "trainer.log", "published")}
    written: dict[str, tuple[float, int, str]] = {}
    loaded: dict[tuple[str, int], float] = {}
    for f in sorted(logs.glob("worker-*.log")):
        for r in _events(f, "file written"):
            written[r["sha256"]] = (r["t"], r["version"], f.stem)
        for r in _events(f, "policy loaded"):
            loaded.setdefault((f.stem, r["version"]), r["t"])
    verdict: dict[str, float] = {}
    for f in sorted(logs.glob("validator*.log")):
        for r in _events(f, "verdict"):
            verdict[r["sha256"]] = min(r["t"], verdict.get(r["sha256"], r["t"]))
    out: dict[str, list[float]] = {k: [] for k in (
        "published_to_loaded", "loaded_to_written", "written_to_verdict", "verdict_to_used",
        "published_to_used", "steps_after_version")}
    for line in (run / "trainer" / "rollouts.jsonl").read_text().splitlines():
        step = json.loads(line)
        for used in step["used"]:
            sha = used["sha256"]
            if sha not in written or sha not in verdict or written[sha][1] not in published:
                continue
            t_written, version, worker = written[sha]
            t_pub = published[version]
            t_loaded = loaded.get((worker, version))
            if t_loaded is not None:
                out["published_to_loaded"].append(t_loaded - t_pub)
                out["loaded_to_written"].append(t_written - t_loaded)
            out["written_to_verdict"].append(verdict[sha] - t_written)
            out["verdict_to_used"].append(step["t"] - verdict[sha])
            out["published_to_used"].append(step["t"] - t_pub)
            out["steps_after_version"].append(step["step"] - version)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a network run directory (its logs/ and trainer/)")
    args = ap.parse_args()
    found = stages(args.run)
    if not found["published_to_used"]:
        print(json.dumps({"error": f"no used file of {args.run} could be traced"}))
        return 1
    for name, values in found.items():
        if values:
            print(json.dumps({"stage": name, **_quantiles(values)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
