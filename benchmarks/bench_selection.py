"""What choosing which work to submit can still buy a worker, under the pool's rules.

A file's problems and sampling noise are fixed by (node, version, counter); a node's counters
at a version are 0 .. files_per_step - 1, each granted one file; a file's step is its version.
So the only choice left to a worker is *not to submit* some of its files (withholding). This
benchmark measures, on the real problem sampler and reward of the demo's rules (arithmetic,
8 prompts x 8 samples per file, 2 files per version), how far each way of choosing moves the
mean reward of the submitted files above the honest mean, and what it costs the chooser:

- `grind-counters` (before: any counter): generate 16 counters, submit the best 4;
- `choose-version` (before: a file's step could lag its version): the best of async_level + 1
  versions for each counter;
- `withhold-k`: submit only the best files_per_step - k of a version's files (now the only
  choice): the chooser forfeits the pay of the k files it withholds.

The policy is a stated model, not a trained one: each completion is right with probability
0.9 when the answer has one digit and 0.45 otherwise (an honest mean reward of about 0.45,
near the 0.53 of the issue's measurement); the rewards are the task's real `compute_reward` of
the right answer or a wrong one. One JSON object per line; `bias` is the submitted mean minus
the honest mean.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from meshrl.pool import Assignment, PoolRules
from meshrl.tasks import compute_reward

NODE = "0x" + "ab" * 20


def _file_reward(rules: PoolRules, tasks, version: int, counter: int, rng: random.Random,
                 node: str) -> float:
    """The mean reward of one file of (node, version, counter) under the stated policy."""
    a = Assignment(rules, node, counter, version)
    total, n = 0.0, 0
    for p in a.problems(tasks):
        right = 0.9 if len(p.answer.lstrip("-")) == 1 else 0.45
        for _ in range(rules.group_size):
            text = p.answer if rng.random() < right else p.answer + "1"
            total += compute_reward(p, text, len(text), tasks).total
            n += 1
    return total / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=40, help="nodes simulated (each its own seed)")
    ap.add_argument("--versions", type=int, default=10, help="policy versions per node")
    a = ap.parse_args()
    rules = PoolRules(pool_id=1, seed=11, prompts_per_file=8, group_size=8, files_per_step=2,
                      async_level=2, task={"type": "arithmetic"})
    tasks = rules.task.build()
    rng = random.Random(0)
    f, lag = rules.files_per_step, rules.async_level
    honest, grind, choose, withhold = [], [], [], {k: [] for k in range(1, f)}
    for i in range(a.nodes):
        node = f"0x{i:040x}"
        for v in range(lag, a.versions + lag):
            files = [_file_reward(rules, tasks, v, c, rng, node) for c in range(f)]
            honest += files
            for k in withhold:
                withhold[k] += sorted(files)[k:]
            for c in range(f):  # before: the same counter at any version of the window
                choose.append(max(_file_reward(rules, tasks, w, c, rng, node)
                                  for w in range(v - lag, v + 1)))
            if v % 4 == 0:  # before: 16 counters made, the best 4 submitted
                many = sorted(_file_reward(rules, tasks, v, 100 + c, rng, node)
                              for c in range(16))
                grind += many[-4:]
    base = statistics.fmean(honest)
    sd = statistics.stdev(honest)

    def line(case: str, xs: list[float], paid: float, allowed: bool) -> None:
        print(json.dumps({"case": case, "files": len(xs), "mean_reward": round(
            statistics.fmean(xs), 4), "honest_mean": round(base, 4), "bias": round(
            statistics.fmean(xs) - base, 4), "pay_fraction": paid,
            "possible_now": allowed}), flush=True)
    print(json.dumps({"case": "honest", "files": len(honest), "mean_reward": round(base, 4),
                      "file_reward_sd": round(sd, 4), "files_per_step": f,
                      "rows_per_file": rules.rows_per_file()}), flush=True)
    line("grind-counters(best 4 of 16)", grind, 1.0, False)
    line(f"choose-version(best of {lag + 1})", choose, 1.0, False)
    for k, xs in withhold.items():
        line(f"withhold-{k}(of {f})", xs, (f - k) / f, True)


if __name__ == "__main__":
    main()
