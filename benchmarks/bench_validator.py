"""Validator cost per rollout file against the worker's cost to generate it (CPU-seconds).

For each completion length (default 8 and 128 tokens, fixed with `ignore_eos` so every row has
exactly that many), a worker generates `--files` rollout files one by one (`prompts` x `group`
rows each: generation, rewards, TOPLOC proofs, Parquet bytes), then a validator judges them the
way it runs, all together (read, assignment and reward checks, shared prefill batches, sampling
replay, termination, log-probs, TOPLOC), and also one file alone. Both run in this process on
`--threads` engine threads; times are process CPU seconds (steadier than wall-clock on a shared
machine; wall-clock is printed too), per file. The goal is a validator cost of at most 1/5 of
the worker's at 128 tokens. One JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model
from meshrl.pool import Assignment, PoolRules
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.replay import ReplayConfig
from meshrl.validator.verify import ChainClaim, verify_files
from meshrl.wire.rollout_file import read_rollout_file, rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts

NODE, PROVIDER = "0x" + "ab" * 20, "0x" + "cd" * 20


def _timed(fn):
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - t


def run(preset: str, tokens: int, prompts: int, group: int, files: int, threads: int) -> dict:
    tok = CharTokenizer()
    model = build_model(preset, tok.vocab_size, seed=0)
    cfg = EngineConfig(num_threads=threads)
    worker, validator = CPUEngine(model, tok, cfg), CPUEngine(model, tok, cfg)
    sampling = {"max_new_tokens": tokens, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True}
    tasks = TasksConfig(mix=[ArithmeticConfig(digits=2)])
    rules = PoolRules(pool_id=1, seed=1, async_level=2, prompts_per_file=prompts,
                      group_size=group, sampling=sampling, task=tasks)
    built = rules.task.build()

    def make(counter: int) -> bytes:
        a = Assignment(rules, NODE, 1, counter, 0)
        return rollout_file_bytes(generate_rollouts(worker, tok, a, built, PROVIDER))

    def judge(blobs: list[bytes]) -> list:
        items = []
        for data in blobs:
            rf = read_rollout_file(data)
            items.append((rf, ChainClaim("", NODE, PROVIDER, rf.header.work_units)))
        return verify_files(validator, tok, items, rules, built, ReplayConfig(max_batch_rows=512))

    judge([make(10_000)])  # warm both engines up
    gen_cpu, gen_wall, blobs = [], [], []
    for counter in range(files):
        data, c, w = _timed(lambda counter=counter: make(counter))
        blobs.append(data), gen_cpu.append(c), gen_wall.append(w)
    one, one_cpu, _ = _timed(lambda: judge(blobs[:1]))  # one file alone
    reps, all_cpu, all_wall = _timed(lambda: judge(blobs))  # all files, shared prefills
    bad = [d.reason for d in [*one, *reps] if not d.accepted]
    if bad:
        raise RuntimeError(f"an honest file was rejected: {bad[0]}")
    g, v = statistics.median(gen_cpu), all_cpu / files
    return {"bench": "validator", "preset": preset, "completion_tokens": tokens,
            "rows_per_file": prompts * group, "files_per_batch": files, "threads": threads,
            "worker_cpu_s_per_file": round(g, 4), "validator_cpu_s_per_file": round(v, 4),
            "validator_over_worker": round(v / g, 4),
            "validator_cpu_s_one_file_alone": round(one_cpu, 4),
            "one_file_alone_over_worker": round(one_cpu / g, 4),
            "worker_wall_s_per_file": round(statistics.median(gen_wall), 4),
            "validator_wall_s_per_file": round(all_wall / files, 4),
            "goal_met": tokens != 128 or v / g <= 0.2, "load_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", nargs="+", default=["qwen2-tiny", "qwen2-4l-256"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 128])
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--files", type=int, default=8, help="files generated, then judged together")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for preset in args.preset:
        for n in args.tokens:
            print(json.dumps(run(preset, n, args.prompts, args.group, args.files,
                                 args.threads)), flush=True)


if __name__ == "__main__":
    main()
