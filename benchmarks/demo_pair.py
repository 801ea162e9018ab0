"""`make demo` beside `make demo-local`: time to 80% held-out accuracy of each, and their ratio.

Reads the two finished runs' `metrics.jsonl` (run them back to back on the same machine):

    meshrl train configs/arithmetic.toml --run.dir /tmp/pair/local
    meshrl network up configs/network.toml --dir /tmp/pair
    python benchmarks/demo_pair.py /tmp/pair/network /tmp/pair/local/arithmetic

One JSON line: for each run the trainer's `elapsed` at its first RL evaluation >= the target
(warm start included), the RL steps it took, the warm start's seconds and the mean seconds of an
RL step; `ratio` = network time / local time (issue 29's goal: at most 1.5). The machine's bound
is stated beside it: the pool shares 2 cores, so an RL step cannot be much shorter than the
pool's CPU-seconds per RL step over 2 (`cpu_s_per_step`: the network's `cpu.json`, every role's
CPU over the whole run divided by the RL steps, so the warm start's CPU is in it too and
`bound_s_per_step` overstates the bound by up to ~10%).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.startswith("{")]


def summary(run: Path, target: float) -> dict[str, Any]:
    """Time to `target` of one run directory holding `metrics.jsonl`."""
    rows = _records(run)
    hit = next((r for r in rows if r["kind"] == "eval" and r.get("phase") == "rl"
                and r["accuracy"] >= target), None)
    if hit is None:
        raise SystemExit(f"{run}: held-out accuracy never reached {target}")
    warm = next(r["elapsed"] for r in rows if r["kind"] == "warm_start")
    steps = [r for r in rows if r["kind"] == "step" and r["step"] <= hit["step"]]
    per_step = (sum(r["step_seconds"] for r in steps) / len(steps) if steps
                else (hit["elapsed"] - warm) / max(1, hit["step"]))
    return {"seconds": round(hit["elapsed"], 1), "steps": hit["step"],
            "warm_start_s": round(warm, 1), "s_per_step": round(per_step, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("network", type=Path, help="the run directory of `meshrl network up`")
    ap.add_argument("local", type=Path, help="the run directory of `meshrl train`")
    ap.add_argument("--target", type=float, default=0.8)
    args = ap.parse_args(argv)
    net = summary(args.network / "trainer", args.target)
    local = summary(args.local, args.target)
    out: dict[str, Any] = {"network": net, "local": local,
                           "ratio": round(net["seconds"] / local["seconds"], 2), "goal": 1.5}
    cpu_file = args.network / "cpu.json"
    if cpu_file.is_file():
        cpu = json.loads(cpu_file.read_text())
        per_step = sum(cpu["roles"].values()) / max(1, net["steps"])
        out["cpu_s_per_step"] = round(per_step, 3)
        out["bound_s_per_step"] = round(per_step / cpu["cores"], 3)  # all cores busy
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
