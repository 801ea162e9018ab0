"""The trainer's reading of a step's files: one isolated child per file (before) against one
child for the step's files (`read_rollout_files_isolated`), on files of the demo's shape (16
prompts x 8 completions, 8 tokens, TOPLOC proofs). Wall time per file; CPU-bound on a shared
machine (each read forks a child from the forkserver). One JSON object per line.

A second line runs this module twice as a `-m` main, as every role runs (`python -m
meshrl.cli`), and times the step's read with the caller's main module preloaded in the fork
server (what `meshrl.wire.isolated` does now) against without (before): each child runs the
main module again, and without the preload it imports what that module imports.

    PYTHONPATH=src python benchmarks/bench_isolated_reads.py [--files 5] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import meshrl.cli  # noqa: F401  (what a role's main module imports: the children run it again)
from meshrl.wire import isolated
from meshrl.wire.isolated import read_rollout_file_isolated, read_rollout_files_isolated
from meshrl.wire.rollout_file import Completion, RolloutFile, RolloutHeader, rollout_file_bytes


def demo_file(seed: int, prompts: int = 16, group: int = 8, tokens: int = 8) -> bytes:
    rng = random.Random(seed)
    header = RolloutHeader(node="0x" + "12" * 20, provider="0x" + "34" * 20, pool_id=1,
                           policy_version=4, rules_sha256="ab" * 32, sampling_seed=seed,
                           toploc_chunk_size=4, toploc_topk=4, work_units=prompts * group)
    rows = [Completion(prompt_id=f"arithmetic/{p}", counter=0, sample_index=g,
                       seq_id=p * group + g, prompt_tokens=[rng.randrange(100) for _ in range(9)],
                       completion_tokens=[rng.randrange(100) for _ in range(tokens)],
                       logprobs=[-rng.random() for _ in range(tokens)],
                       reward=float(rng.random() > 0.5), finish_reason="stop",
                       toploc_proofs=[rng.randbytes(10) for _ in range(tokens // 4)])
            for p in range(prompts) for g in range(group)]
    return rollout_file_bytes(RolloutFile(header, rows))


def _step_reads(datas: list[bytes], rounds: int) -> float:
    """Seconds per file of `rounds` step reads (one child each), the fork server started."""
    read_rollout_files_isolated(datas)
    t0 = time.perf_counter()
    for _ in range(rounds):
        assert all(not isinstance(r, Exception) for r in read_rollout_files_isolated(datas))
    return (time.perf_counter() - t0) / (rounds * len(datas))


def _as_main(files: int, rounds: int) -> dict[str, float]:
    """ms per file read as a `-m` main, with the main module preloaded and without."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    out = {}
    for mode in ("without", "preloaded"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_isolated_reads",
                               "--as-main", mode, "--files", str(files), "--rounds", str(rounds)],
                              capture_output=True, text=True, env=env, cwd=root, check=True)
        out[mode] = float(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=5, help="files per step (the demo: 4-5)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--as-main", choices=["without", "preloaded"], default=None,
                    help=argparse.SUPPRESS)  # the child of the second measurement
    a = ap.parse_args()
    datas = [demo_file(i) for i in range(a.files)]
    if a.as_main is not None:
        assert isolated._main_module() == ["benchmarks.bench_isolated_reads"]
        if a.as_main == "without":
            isolated._main_module = lambda: []  # the fork server as it was
        print(_step_reads(datas, a.rounds) * 1e3)
        return
    read_rollout_files_isolated(datas)  # the forkserver started
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        for d in datas:
            read_rollout_file_isolated(d)
    each = (time.perf_counter() - t0) / (a.rounds * a.files)
    t0 = time.perf_counter()
    for _ in range(a.rounds):
        assert all(not isinstance(r, Exception) for r in read_rollout_files_isolated(datas))
    together = (time.perf_counter() - t0) / (a.rounds * a.files)
    print(json.dumps({"bench": "isolated_reads", "files": a.files, "bytes": len(datas[0]),
                      "rounds": a.rounds, "ms_per_file_one_child_each": round(each * 1e3, 2),
                      "ms_per_file_one_child_per_step": round(together * 1e3, 2),
                      "speedup": round(each / together, 2), "load_avg": os.getloadavg()[0],
                      "bound": "CPU (fork + Parquet decode), 2 shared cores"}))
    ms = _as_main(a.files, a.rounds)
    print(json.dumps({"bench": "isolated_reads_main_module", "files": a.files,
                      "ms_per_file_main_module_preloaded": round(ms["preloaded"], 2),
                      "ms_per_file_before": round(ms["without"], 2),
                      "speedup": round(ms["without"] / ms["preloaded"], 2),
                      "load_avg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
