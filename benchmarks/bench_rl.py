"""RL trainer benchmarks (one JSON object per line).

1. `rollout`: generated tokens/s of each inference backend (reference HF loop, CPU engine) for the
   same batch shape (random weights, so completions often run to the length cap).
2. `async_vs_sync`: wall time per step of async_level 2 vs 0 on the same config (generator in a
   child process; `speedup`; best of `--repeats` alternating runs of each), and vs a
   synchronous run with generation in the trainer's process at its best thread count, 1 or 2
   (`speedup_vs_best_inprocess_sync`). `gen_to_train`
   (synchronous generation time over training time) shows whether the two phases take
   comparable time, where overlap pays most. On 2 cores the overlap costs the trainer its
   second thread, which bounds what async can gain there.
3. `trainer_vs_trl`: the same work (qwen2-tiny, char tokenizer, 2-digit addition, 8 prompts x 8
   completions, <= 8 new tokens, one optimizer step per batch, no group filtering) through
   meshrl's trainer and TRL's GRPOTrainer, in this process: `speedup` = our steps/s at our
   best setting (async with the generator in a child process, or synchronous in one process
   on 2 threads) over TRL's at its best thread count (1 or 2); every setting is reported.
   From a random policy every completion runs to the length cap, which is not the work RL does:
4. `trainer_vs_trl_warm`: the same comparison from one warm-started policy (qwen2-tiny after
   `--warm-steps` supervised steps on 2-digit addition, so completions are answers of ~3-4
   tokens), which both trainers load; reports the mean completion length each saw and its own
   `speedup`.

Usage: python benchmarks/bench_rl.py [--steps 30] [--skip-trl] [--only-trl] [--repeats 3]
       [--async-configs 8x8x8 1x8x96 1x4x128] [--trl-starts random warm] [--warm-steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def ours(steps: int, async_level: int, threads: int, prompts: int, group: int,
         tokens: int, subprocess: bool = False, model_dir: str | None = None) -> dict[str, float]:
    from meshrl.config import load_config
    from meshrl.rl.config import RLConfig
    from meshrl.rl.loop import train
    from meshrl.rl.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(RLConfig, [], [
            "--run.dir", tmp, "--run.progress", "false", "--run.plot", "false",
            "--run.threads", str(threads), "--run.checkpoint_every", "100000",
            "--sft.max_steps", "0", "--eval.num_problems", "8", "--eval.every", "100000",
            "--steps", str(steps), "--async_level", str(async_level), "--filter_groups", "false",
            "--rollout.prompts_per_step", str(prompts), "--rollout.group_size", str(group),
            "--rollout.max_new_tokens", str(tokens), "--trainer.lr", "1e-4",
            "--rollout.subprocess", str(subprocess).lower(),
            *(["--model.path", model_dir] if model_dir else []),
        ])
        train(cfg)
        rows = [r for r in read_metrics(Path(tmp) / cfg.run.name / "metrics.jsonl")
                if r["kind"] == "step"][2:]
    return {
        "threads": threads,
        "step_seconds": statistics.mean(r["step_seconds"] for r in rows),
        "train_seconds": statistics.mean(r.get("train_seconds", 0.0) for r in rows),
        "tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["step_seconds"] for r in rows),
        "gen_seconds": statistics.mean(r["gen_seconds"] for r in rows),
        "wait_seconds": statistics.mean(r["wait_seconds"] for r in rows),
        "completion_tokens_mean": statistics.mean(r["completion_tokens"] for r in rows)
        / (prompts * group),
    }


def warm_policy(directory: str, steps: int) -> str:
    """qwen2-tiny after `steps` supervised steps on 2-digit addition (meshrl's warm-start, no
    early stop), saved to `directory`: it answers in a few tokens, as RL's starting policy does."""
    from meshrl.model import CharTokenizer, build_model, save_model
    from meshrl.rl.config import SFTConfig
    from meshrl.rl.sft import warm_start
    from meshrl.tasks import TasksConfig

    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=0)
    cfg = SFTConfig(max_steps=steps, eval_every=steps, target_accuracy=1.0, max_accuracy=1.0)
    warm_start(model, tok, cfg, TasksConfig().build(), lambda step: 0.0, seed=0)
    save_model(model, tok, directory)
    return directory


def trainer_vs_trl(steps: int, shape: dict, model_dir: str | None) -> dict:
    """Our best setting against TRL's best thread count on the same work and starting policy."""
    from _trl_baseline import run_trl

    runs = {"async_level 2, generator process": ours(steps, 2, 2, **shape, subprocess=True,
                                                     model_dir=model_dir),
            "async_level 0, one process": ours(steps, 0, 2, **shape, model_dir=model_dir)}
    mine_name, mine = min(runs.items(), key=lambda kv: kv[1]["step_seconds"])
    trls = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        trls.append({"threads": threads, **run_trl(steps, shape["prompts"], shape["group"],
                                                    shape["tokens"], lr=1e-4,
                                                    model_dir=model_dir)})
    trl = min(trls, key=lambda r: r["step_seconds"])
    return {
        "bench": "trainer_vs_trl_warm" if model_dir else "trainer_vs_trl", "config": shape,
        "ours_step_seconds": mine["step_seconds"], "trl_step_seconds": trl["step_seconds"],
        "ours_setting": mine_name,
        "ours_step_seconds_by_setting": {k: v["step_seconds"] for k, v in runs.items()},
        "trl_threads": trl["threads"],
        "trl_step_seconds_by_threads": {r["threads"]: r["step_seconds"] for r in trls},
        "ours_completion_tokens_mean": mine["completion_tokens_mean"],
        "trl_completion_tokens_mean": trl["completion_tokens_mean"],
        "ours_tokens_per_s": mine["tokens_per_s"],
        "trl_tokens_per_s": trl["tokens_seen"] / steps / trl["step_seconds"],
        "speedup": trl["step_seconds"] / mine["step_seconds"],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def rollout_throughput(backend: str, prompts: int, group: int, tokens: int,
                       repeats: int = 10) -> dict:
    from meshrl.inference import SamplingParams, build_backend
    from meshrl.model import CharTokenizer, build_model

    tok = CharTokenizer()
    gen = build_backend(backend, build_model("qwen2-tiny", tok.vocab_size), tok)
    batch = [[1, *tok.encode(f"{i % 100}+{(7 * i) % 100}=")] for i in range(prompts * group)]

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=tokens, seed=seed)

    gen.generate(batch, params(0), list(range(len(batch))))
    t0 = time.perf_counter()
    for r in range(repeats):
        gen.generate(batch, params(r), list(range(len(batch))))
    dt = (time.perf_counter() - t0) / repeats
    outs = gen.generate(batch, params(0), list(range(len(batch))))
    generated = sum(len(o.token_ids) for o in outs)
    return {"bench": "rollout", "backend": backend, "batch": len(batch), "max_new_tokens": tokens,
            "seconds": dt, "tokens_per_s": generated / dt}


def async_vs_sync(steps: int, config: dict, repeats: int) -> dict:
    """async_level 2 vs 0 on the same config (generator in a child process, 2 threads), run
    alternately `repeats` times each, the best (lowest mean step time) run of each mode counting:
    on a shared machine the same synchronous run measured 0.08-0.15 s of generation per step, so
    one pair of runs says little. Also against a synchronous run with everything in one process
    at its best thread count (one run each)."""
    syncs, asyncs = [], []
    for _ in range(repeats):
        syncs.append(ours(steps, 0, 2, **config, subprocess=True))
        asyncs.append(ours(steps, 2, 2, **config, subprocess=True))
    sync = min(syncs, key=lambda r: r["step_seconds"])
    asyn = min(asyncs, key=lambda r: r["step_seconds"])
    inproc = [ours(steps, 0, t, **config) for t in (1, 2)]
    best = min(inproc, key=lambda r: r["step_seconds"])
    return {"bench": "async_vs_sync", "config": config, "repeats": repeats,
            "threads": "2: async = generator 1 (child process) + trainer 1; sync = generator 1 "
                       "(child process), trainer 2 while it waits",
            "sync_step_seconds": sync["step_seconds"],
            "async_step_seconds": asyn["step_seconds"],
            "sync_step_seconds_runs": [r["step_seconds"] for r in syncs],
            "async_step_seconds_runs": [r["step_seconds"] for r in asyncs],
            "sync_gen_seconds": sync["gen_seconds"],
            "sync_train_seconds": sync["train_seconds"],
            "async_gen_seconds": asyn["gen_seconds"],
            "async_train_seconds": asyn["train_seconds"],
            "gen_to_train": sync["gen_seconds"] / max(sync["train_seconds"], 1e-9),
            "async_wait_seconds": asyn["wait_seconds"],
            "speedup": sync["step_seconds"] / asyn["step_seconds"],
            "inprocess_sync_step_seconds_by_threads": {r["threads"]: r["step_seconds"]
                                                       for r in inproc},
            "speedup_vs_best_inprocess_sync": best["step_seconds"] / asyn["step_seconds"],
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--repeats", type=int, default=3,
                    help="alternating async / sync runs per config; the best of each counts")
    ap.add_argument("--async-configs", nargs="+", default=["8x8x8", "1x8x96", "1x4x128"],
                    help="prompts x group x max-new-tokens of the async-vs-sync runs (one line "
                         "each); in 1x8x96 and 1x4x128 generation and training take "
                         "comparable time")
    ap.add_argument("--only-trl", action="store_true", help="only the two TRL comparisons")
    ap.add_argument("--trl-starts", nargs="+", choices=["random", "warm"],
                    default=["random", "warm"], help="starting policies of the TRL comparisons")
    ap.add_argument("--warm-steps", type=int, default=300,
                    help="supervised steps of the warm-started policy of trainer_vs_trl_warm")
    args = ap.parse_args()
    shape = dict(prompts=8, group=8, tokens=8)
    torch.set_num_threads(1)
    if not args.only_trl:
        for backend in ("reference", "engine"):
            print(json.dumps(rollout_throughput(backend, **shape)), flush=True)
        for spec in args.async_configs:
            prompts, group, tokens = (int(x) for x in spec.split("x"))
            config = dict(prompts=prompts, group=group, tokens=tokens)
            print(json.dumps(async_vs_sync(args.steps, config, args.repeats)), flush=True)
    if args.skip_trl:
        return
    if "random" in args.trl_starts:
        print(json.dumps(trainer_vs_trl(args.steps, shape, None)), flush=True)
    if "warm" not in args.trl_starts:
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.set_num_threads(1)  # two threads crawl when the machine is oversubscribed
        warm = warm_policy(str(Path(tmp) / "warm"), args.warm_steps)
        print(json.dumps(trainer_vs_trl(args.steps, shape, warm)), flush=True)


if __name__ == "__main__":
    main()
