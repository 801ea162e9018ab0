"""math-verify scoring in the killable child (tasks/killable.py) vs in the caller's process.

Scores the same rows both ways in one process: honest-looking completions (a \\boxed{} answer
after some text, right and wrong, fractions and expressions), then one hostile answer that holds
the GIL in sympy (`\\boxed{9^{9^{9^{9}}}}`), which only the child can bound. One JSON line per
path with rows/s and the mean / max milliseconds of a row; then `ratio` = child seconds per row
/ in-process seconds per row (the price of killability); then the hostile row's seconds to
its 0 at a `--deadline` (in-process: not run, it never ends). Then the same for a
reasoning-gym task scored through `task_reward` (countdown: `score_answer` is sympy's
`parse_expr`, which never ends on `9**9**9**9`): in-process `Task.score` vs the child.
The same for chain_sum, whose scorer parses
integers and runs no text (`Task.runs_answer_code` False): its rows skip the fork per row.
`child_start_s`: the first row's seconds (the child started, in bubblewrap, and math-verify
imported), the price of each fresh child.

    PYTHONPATH=src python benchmarks/bench_killable_scoring.py [--rows 200] [--deadline 2]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from meshrl.tasks import GymConfig, TasksConfig, compute_reward
from meshrl.tasks.killable import KillableScorer, _score_in_process, scorer

_ANSWERS = ["1/2", "5x", "42", "\\frac{3}{4}", "x^2+1", "0.25", "7", "\\sqrt{2}"]


def _rows(n: int) -> list[tuple[str, str]]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        gold = rng.choice(_ANSWERS)
        said = gold if rng.random() < 0.5 else rng.choice(_ANSWERS)
        out.append((gold, "Let me think step by step. " * rng.randint(1, 20)
                    + f"So the answer is $\\boxed{{{said}}}$."))
    return out


def _line(path: str, times: list[float]) -> dict[str, object]:
    return {"path": path, "rows": len(times), "rows_per_s": round(len(times) / sum(times), 1),
            "mean_ms": round(1e3 * sum(times) / len(times), 3),
            "max_ms": round(1e3 * max(times), 3)}


def _compare(rows: list, local_score, child_score, prefix: str, ratio_key: str) -> None:
    """Each row scored in-process then in the child, timed apart; the two paths' JSON lines
    and the child / in-process ratio (and how many rows scored the same both ways)."""
    local, child, same = [], [], 0
    for row in rows:
        t0 = time.perf_counter()
        x = local_score(*row)
        t1 = time.perf_counter()
        y = child_score(*row)
        t2 = time.perf_counter()
        local.append(t1 - t0)
        child.append(t2 - t1)
        same += x == y
    print(json.dumps(_line(f"{prefix}in_process", local)))
    print(json.dumps(_line(f"{prefix}killable_child", child)))
    print(json.dumps({ratio_key: round(sum(child) / sum(local), 3), "same_scores": same,
                      "rows": len(rows)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--deadline", type=float, default=2.0)
    args = ap.parse_args()
    rows = _rows(args.rows)
    s = KillableScorer()
    try:
        t0 = time.perf_counter()
        s.math_verify("1", "\\boxed{1}", 60.0)  # start the child (imports) before timing
        print(json.dumps({"child_start_s": round(time.perf_counter() - t0, 3)}))
        for a, c in rows[:10]:  # warm both paths' caches alike
            _score_in_process(a, c, 5.0)
            s.math_verify(a, c, 5.0)
        _compare(rows, lambda a, c: _score_in_process(a, c, 5.0),
                 lambda a, c: s.math_verify(a, c, 5.0).score, "", "ratio")
        t0 = time.perf_counter()
        out = s.math_verify("1", "\\boxed{9^{9^{9^{9}}}}", args.deadline)
        print(json.dumps({"hostile_row_s": round(time.perf_counter() - t0, 3),
                          "deadline_s": args.deadline, "score": out.score,
                          "timed_out": out.timed_out, "in_process": "never ends"}))
    finally:
        s.close()
    _gym(args.rows, args.deadline, "countdown")  # forked per row: its scorer evals text
    _gym(args.rows, args.deadline, "chain_sum")  # scored in the child itself: it parses ints


def _gym(n: int, deadline: float, dataset: str) -> None:
    tasks = TasksConfig(mix=[GymConfig(dataset=dataset, timeout_s=deadline)]).build()
    task = tasks.tasks[f"rg/{dataset}"]
    print(json.dumps({"gym_dataset": dataset, "forked_per_row": task.runs_answer_code()}))
    rng = random.Random(1)
    rows = []
    for _ in range(n):
        p = task.sample(rng)
        rows.append((p, f"<answer>{p.answer if rng.random() < 0.5 else '1+2'}</answer>"))
    compute_reward(rows[0][0], rows[0][1], 5, tasks)  # the child up and the task built
    _compare(rows, task.score, lambda p, c: compute_reward(p, c, 5, tasks).task, "gym_",
             "gym_ratio")
    t0 = time.perf_counter()
    r = compute_reward(rows[0][0], "<answer>9**9**9**9</answer>", 5, tasks)
    t1 = time.perf_counter()
    compute_reward(rows[0][0], rows[0][1], 5, tasks)  # a fresh child, the task rebuilt
    print(json.dumps({"gym_hostile_row_s": round(t1 - t0, 3), "deadline_s": deadline,
                      "score": r.task, "next_row_s (restart + rebuild)":
                      round(time.perf_counter() - t1, 3), "in_process": "never ends"}))
    scorer().close()


if __name__ == "__main__":
    main()
