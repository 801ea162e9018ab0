"""Validator cost per rollout file against the worker's cost to generate it (CPU-seconds).

For each completion length (default 8 and 128 tokens, fixed with `ignore_eos` so every row has
exactly that many), a worker generates `--files` rollout files one by one (`prompts` x `group`
rows each: generation, rewards, TOPLOC proofs, Parquet bytes), then a validator judges them the
way it runs, all together (read, assignment and reward checks, shared prefill batches, sampling
replay, termination, log-probs, TOPLOC): once replaying every row (`full`), once replaying the
rows the pool's default sampled-replay rule picks (`sampled`, `meshrl.pool.ReplayRule()`, each
file with a block hash of its own), and one file alone in full. The rounds (`--repeats`)
interleave generation, full and sampled judging in this process, so a loaded machine weighs on
all three alike; each ratio is the median over rounds. Times are process CPU seconds on
`--threads` engine threads (steadier than wall-clock on a shared machine; wall-clock is printed
too), per file. The goal is a validator cost of at most 1/5 of the worker's at 128 tokens under
the default rule. One JSON object per line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time

import torch

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model
from meshrl.pool import Assignment, PoolRules, ReplayRule, replayed_count
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.replay import ReplayConfig
from meshrl.validator.verify import ChainClaim, verify_files
from meshrl.wire.rollout_file import read_rollout_file, rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts

NODE, PROVIDER = "0x" + "ab" * 20, "0x" + "cd" * 20


def _timed(fn, *args):
    c, t = time.process_time(), time.perf_counter()
    out = fn(*args)
    return out, time.process_time() - c, time.perf_counter() - t


def run(preset: str, tokens: int, prompts: int, group: int, files: int, threads: int,
        repeats: int, rule: ReplayRule) -> dict:
    tok = CharTokenizer()
    model = build_model(preset, tok.vocab_size, seed=0)
    cfg = EngineConfig(num_threads=threads)
    worker, validator = CPUEngine(model, tok, cfg), CPUEngine(model, tok, cfg)
    sampling = {"max_new_tokens": tokens, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True}
    tasks = TasksConfig(mix=[ArithmeticConfig(digits=2)])
    rules = PoolRules(pool_id=1, seed=1, async_level=2, prompts_per_file=prompts,
                      group_size=group, sampling=sampling, task=tasks, replay=rule,
                      files_per_step=1 << 16)
    built = rules.task.build()

    def make(counter: int) -> bytes:
        a = Assignment(rules, NODE, counter, 0)
        return rollout_file_bytes(generate_rollouts(worker, tok, a, built, PROVIDER))

    def judge(blobs: list[bytes], sampled: bool) -> list:
        items = []
        for data in blobs:
            rf = read_rollout_file(data)
            sha = hashlib.sha256(data).hexdigest()
            block = hashlib.sha256(b"block of " + data).hexdigest() if sampled else None
            items.append((rf, ChainClaim(sha, NODE, PROVIDER, rf.header.work_units, block)))
        return verify_files(validator, tok, items, rules, built, ReplayConfig(max_batch_rows=512))

    judge([make(10_000)], False), judge([make(10_001)], True)  # warm both engines up
    gen, full, sampled, full_wall, sampled_wall, gen_wall, one = [], [], [], [], [], [], []
    for rep in range(repeats):
        blobs, cpu = [], []
        for counter in range(files):
            data, c, w = _timed(make, rep * files + counter)
            blobs.append(data), cpu.append(c), gen_wall.append(w)
        gen.append(statistics.median(cpu))
        ones, c, _ = _timed(judge, blobs[:1], False)  # one file alone
        one.append(c)
        reps_full, c, w = _timed(judge, blobs, False)  # every row replayed
        full.append(c / files), full_wall.append(w / files)
        reps_sampled, c, w = _timed(judge, blobs, True)  # the rule's rows
        sampled.append(c / files), sampled_wall.append(w / files)
        bad = [d.reason for d in [*ones, *reps_full, *reps_sampled] if not d.accepted]
        if bad:
            raise RuntimeError(f"an honest file was rejected: {bad[0]}")
    ratio_full = statistics.median(f / g for f, g in zip(full, gen, strict=True))
    ratio_sampled = statistics.median(s / g for s, g in zip(sampled, gen, strict=True))
    g = statistics.median(gen)
    return {"bench": "validator", "preset": preset, "completion_tokens": tokens,
            "rows_per_file": prompts * group, "files_per_batch": files, "repeats": repeats,
            "threads": threads, "rows_fraction": rule.rows_fraction,
            "rows_replayed": replayed_count(rule, prompts * group),
            "worker_cpu_s_per_file": round(g, 4),
            "validator_cpu_s_per_file": round(statistics.median(sampled), 4),
            "validator_over_worker": round(ratio_sampled, 4),
            "full_replay_cpu_s_per_file": round(statistics.median(full), 4),
            "full_replay_over_worker": round(ratio_full, 4),
            "ratio": round(ratio_sampled / ratio_full, 4),  # sampled over full replay
            "validator_cpu_s_one_file_alone": round(statistics.median(one), 4),
            "one_file_alone_over_worker": round(statistics.median(one) / g, 4),
            "worker_wall_s_per_file": round(statistics.median(gen_wall), 4),
            "validator_wall_s_per_file": round(statistics.median(sampled_wall), 4),
            "full_replay_wall_s_per_file": round(statistics.median(full_wall), 4),
            "goal_met": tokens != 128 or ratio_sampled <= 0.2, "load_1min": os.getloadavg()[0],
            "bound": f"CPU, {threads} torch thread(s), process CPU time on a shared machine"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", nargs="+", default=["qwen2-tiny", "qwen2-4l-256"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8, 128])
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--files", type=int, default=8, help="files generated, then judged together")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    ap.add_argument("--rows-fraction", type=float, default=None,
                    help="replay.rows_fraction (default: the rule's default)")
    args = ap.parse_args()
    rule = ReplayRule() if args.rows_fraction is None else \
        ReplayRule(rows_fraction=args.rows_fraction)
    torch.set_num_threads(args.threads)
    for preset in args.preset:
        for n in args.tokens:
            print(json.dumps(run(preset, n, args.prompts, args.group, args.files,
                                 args.threads, args.repeats, rule)), flush=True)


if __name__ == "__main__":
    main()
