"""The spread over seeds of what tests/rl/test_learning.py asserts (one JSON object per line).

Each run is `configs/learning.toml` (warm-start, then 100 lockstep GRPO steps on 1-digit
addition) with `--run.seed` set, in a fresh process (optionally with torch's CPU kernel set forced
by `ATEN_CPU_CAPABILITY`: another machine's kernels give another trajectory from the same seed).
Its `gain` is the test's quantity: mean batch accuracy (verifier score of the 16 x 8 sampled
completions) over the last 20 RL steps minus the first 20. `digest` hashes every step's numbers;
`--repeat` runs each seed twice and reports whether the digests agree. One summary line per
backend and kernel set, and one over all runs: min / mean / max of `gain`, and how many runs the
test's margin (`--margin`) would pass.

Usage: python benchmarks/bench_learning_spread.py [--seeds 0 1 ... 9] [--backends engine reference]
       [--kernels native avx2 default] [--repeat] [--margin 0.08]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "learning.toml"
# the per-step numbers that follow from the seed (not timings)
STEP_KEYS = ("version", "reward", "accuracy", "loss", "entropy", "grad_norm", "kept_groups",
             "completion_tokens", "truncated")


def gain(steps: list[dict]) -> tuple[float, float]:
    """Mean batch accuracy of the first and of the last 20 RL steps."""
    acc = [r["accuracy"] for r in steps]
    return sum(acc[:20]) / 20, sum(acc[-20:]) / 20


def digest(steps: list[dict]) -> str:
    return hashlib.sha256(json.dumps(
        [[r.get(k) for k in STEP_KEYS] for r in steps]).encode()).hexdigest()[:16]


def one_run(seed: int, backend: str) -> dict:
    """This process: the configured run with `seed` and `backend`, summarised."""
    import torch

    from meshrl.config import load_config
    from meshrl.rl.config import RLConfig
    from meshrl.rl.loop import train
    from meshrl.rl.metrics import read_metrics

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(RLConfig, [CONFIG], ["--run.dir", tmp, "--run.seed", str(seed),
                                               "--rollout.backend", backend])
        t0 = time.perf_counter()
        summary = train(cfg)
        seconds = time.perf_counter() - t0
        records = read_metrics(Path(tmp) / cfg.run.name / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    warm = next(r for r in records if r["kind"] == "warm_start")
    first, last = gain(steps)
    return {"seed": seed, "backend": backend, "warm_accuracy": warm["accuracy"],
            "first20": round(first, 6), "last20": round(last, 6), "gain": round(last - first, 6),
            "heldout_final": summary["accuracy"], "digest": digest(steps),
            "seconds": round(seconds, 2)}


def child(seed: int, backend: str, kernels: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "OMP_NUM_THREADS": "1"}
    if kernels != "native":
        env["ATEN_CPU_CAPABILITY"] = kernels
    out = subprocess.run([sys.executable, __file__, "--child", str(seed), backend],
                         capture_output=True, text=True, env=env, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return {"kernels": kernels, **json.loads(line[len("RESULT "):])}


def summary(rows: list[dict], margin: float, **labels: object) -> dict:
    gains = [r["gain"] for r in rows]
    return {"summary": True, **labels, "runs": len(rows), "gain_min": min(gains),
            "gain_mean": round(statistics.mean(gains), 6), "gain_max": max(gains),
            "gain_stdev": round(statistics.stdev(gains), 6) if len(gains) > 1 else 0.0,
            "margin": margin, "pass": sum(g >= margin for g in gains),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--backends", nargs="+", default=["engine"])
    parser.add_argument("--kernels", nargs="+", default=["native"],
                        help="ATEN_CPU_CAPABILITY values (native: the machine's own)")
    parser.add_argument("--margin", type=float, default=0.08, help="the test's margin")
    parser.add_argument("--repeat", action="store_true", help="run every seed twice")
    parser.add_argument("--child", nargs=2, metavar=("SEED", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one_run(int(args.child[0]), args.child[1])), flush=True)
        return
    everything = []
    for kernels in args.kernels:
        for backend in args.backends:
            rows = []
            for seed in args.seeds:
                row = child(seed, backend, kernels)
                if args.repeat:
                    row["reproduced"] = child(seed, backend, kernels)["digest"] == row["digest"]
                print(json.dumps(row), flush=True)
                rows.append(row)
            print(json.dumps(summary(rows, args.margin, backend=backend, kernels=kernels)),
                  flush=True)
            everything += rows
    print(json.dumps(summary(everything, args.margin, backend="all", kernels="all")),
          flush=True)


if __name__ == "__main__":
    main()
