"""Validator cost per rollout file against the worker's cost to generate it (CPU-seconds).

For each completion length (default 8 and 128 tokens, fixed with `ignore_eos` so every row has
exactly that many), a worker generates a rollout file (`prompts` x `group` rows: generation,
rewards, TOPLOC proofs, Parquet bytes) and a validator judges it (read, assignment and reward
checks, one batched prefill, sampling replay, termination, log-probs, TOPLOC). Both run in this
process on `--threads` engine threads; the times are the median over `--repeats` files of process
CPU time (steadier than wall-clock on a shared machine; wall-clock is printed too). The goal is a
validator cost of at most 1/5 of the worker's at 128 tokens. One JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.model import CharTokenizer, build_model
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.replay import ReplayConfig
from meshrl.validator.verify import ChainClaim, PoolRules, verify_file
from meshrl.wire.rollout_file import read_rollout_file, rollout_file_bytes
from meshrl.worker.rollouts import Assignment, generate_rollouts

NODE, PROVIDER = "0x" + "ab" * 20, "0x" + "cd" * 20


def _timed(fn):
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - t


def run(preset: str, tokens: int, prompts: int, group: int, repeats: int, threads: int) -> dict:
    tok = CharTokenizer()
    model = build_model(preset, tok.vocab_size, seed=0)
    cfg = EngineConfig(num_threads=threads)
    worker, validator = CPUEngine(model, tok, cfg), CPUEngine(model, tok, cfg)
    sampling = {"max_new_tokens": tokens, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True}
    tasks = TasksConfig(mix=[ArithmeticConfig(digits=2)])
    rules = PoolRules(seed=1, async_level=2, prompts_per_file=prompts, group_size=group,
                      sampling=sampling, tasks=tasks)
    gen_cpu, gen_wall, val_cpu, val_wall = [], [], [], []
    for counter in range(repeats + 1):  # the first file warms both engines up
        a = Assignment(1, NODE, 1, 0, counter, prompts, group, SamplingParams(**sampling), tasks)
        data, gc, gw = _timed(lambda a=a: rollout_file_bytes(
            generate_rollouts(worker, tok, a, PROVIDER)))

        def judge(data=data):
            rf = read_rollout_file(data)
            claim = ChainClaim("", NODE, PROVIDER, rf.header.work_units)
            return verify_file(validator, tok, rf, claim, rules, ReplayConfig())

        rep, vc, vw = _timed(judge)
        if not rep.accepted:
            raise RuntimeError(f"an honest file was rejected: {rep.reason()}")
        if counter:
            gen_cpu.append(gc), gen_wall.append(gw), val_cpu.append(vc), val_wall.append(vw)
    g, v = statistics.median(gen_cpu), statistics.median(val_cpu)
    return {"bench": "validator", "preset": preset, "completion_tokens": tokens,
            "rows_per_file": prompts * group, "threads": threads, "files": repeats,
            "worker_cpu_s": round(g, 4), "validator_cpu_s": round(v, 4),
            "validator_over_worker": round(v / g, 4),
            "worker_wall_s": round(statistics.median(gen_wall), 4),
            "validator_wall_s": round(statistics.median(val_wall), 4),
            "goal_met": tokens != 128 or v / g <= 0.2, "load_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", nargs="+", default=["qwen2-tiny", "qwen2-4l-256"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 128])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for preset in args.preset:
        for n in args.tokens:
            print(json.dumps(run(preset, n, args.prompts, args.group, args.repeats,
                                 args.threads)), flush=True)


if __name__ == "__main__":
    main()
