"""Trainer step time at 1 and 2 ranks (FSDP2 under torchrun, gloo on CPU) vs one process.

The same batch every time: the demo's shape (64 prompts x 8 completions of 2-digit addition:
7-token prompts, 1-4-token completions, qwen2-tiny), `trainer.micro_batch_size` 256, one torch
thread per process. Each configuration prints one JSON line: `mode` (`single`: the plain
`Trainer` in this process; `fsdp`: `FSDPTrainer` under torchrun), `ranks`, the median and best
`step_seconds` over `--steps` steps after `--warmup` steps, `ratio` = single / this (higher is
faster), and the 1-minute load average. On the 2-core development machine two ranks compete
with each other and with every other job for the two cores, so the numbers are informative
only: what FSDP costs over one process (gathers, reduce-scatters, padding passes) at a size
where there is nothing to gain from sharding.

Usage: python benchmarks/bench_fsdp.py [--steps 20] [--warmup 3] [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPTS, GROUP = 64, 8


def batch_rows(seed: int = 0):
    """Prompts, completions, inference log-probs and advantages of one demo-shaped batch."""
    from meshrl.model import CharTokenizer

    tok = CharTokenizer()
    g = torch.Generator().manual_seed(seed)
    prompts, completions, logprobs = [], [], []
    for _ in range(PROMPTS):
        a, b = torch.randint(10, 100, (2,), generator=g).tolist()
        prompt = [tok.bos_token_id, *tok.encode(f"{a}+{b}=")]
        for _ in range(GROUP):
            n = int(torch.randint(1, 5, (1,), generator=g))
            digits = torch.randint(0, 10, (n,), generator=g).tolist()
            completions.append(tok.encode("".join(map(str, digits))))
            logprobs.append((-torch.rand(n, generator=g) * 2).tolist())
            prompts.append(prompt)
    return tok, prompts, completions, logprobs, torch.randn(PROMPTS * GROUP, generator=g)


def _configs():
    from meshrl.rl.config import LossConfig, TrainerConfig

    return TrainerConfig(lr=1e-4, warmup_steps=0, micro_batch_size=256), LossConfig()


def _time(step, steps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def single(steps: int, warmup: int) -> list[float]:
    from meshrl.model import build_model
    from meshrl.rl.packing import pack_groups
    from meshrl.rl.trainer import Trainer

    tok, prompts, completions, logprobs, adv = batch_rows()
    trainer = Trainer(build_model("qwen2-tiny", tok.vocab_size, seed=0), *_configs())
    batch = pack_groups(prompts, completions, logprobs, tok.pad_token_id)
    return _time(lambda: trainer.train_step(batch, adv), steps, warmup)


def rank_main(steps: int, warmup: int) -> None:
    """One rank of the torchrun job: its share of the batch, FSDP steps; rank 0 prints."""
    from meshrl.model import build_model
    from meshrl.rl.config import DistributedConfig
    from meshrl.rl.distributed import FSDPTrainer, init_world, rank_share, shard_policy
    from meshrl.rl.packing import pack_groups

    torch.set_num_threads(1)
    world = init_world(DistributedConfig(), os.environ)
    try:
        tok, prompts, completions, logprobs, adv = batch_rows()
        policy = shard_policy(build_model("qwen2-tiny", tok.vocab_size, seed=0), world,
                              DistributedConfig(), 1.0)
        trainer = FSDPTrainer(policy, world, *_configs())
        rows = [g * GROUP + j for g in rank_share(PROMPTS, world.rank, world.size)
                for j in range(GROUP)]
        share = pack_groups([prompts[i] for i in rows], [completions[i] for i in rows],
                            [logprobs[i] for i in rows], tok.pad_token_id)
        times = _time(lambda: trainer.train_share(share, adv[rows], total_rows=len(adv)),
                      steps, warmup)
        if world.is_main:
            print("RESULT " + json.dumps(times), flush=True)
    finally:
        world.close()


def _row(mode: str, ranks: int, times: list[float], baseline: float | None) -> dict:
    med = statistics.median(times)
    return {"bench": "fsdp_step", "mode": mode, "ranks": ranks,
            "step_seconds_median": round(med, 4), "step_seconds_best": round(min(times), 4),
            "ratio": round(baseline / med, 3) if baseline else 1.0,
            "batch": f"{PROMPTS}x{GROUP}", "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:
        return rank_main(args.steps, args.warmup)
    torch.set_num_threads(1)
    times = single(args.steps, args.warmup)
    base = statistics.median(times)
    print(json.dumps(_row("single", 1, times, base)), flush=True)
    for n in args.ranks:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={n}", str(Path(__file__).resolve()),
               f"--steps={args.steps}", f"--warmup={args.warmup}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        times = json.loads(next(line for line in out.splitlines()
                                if line.startswith("RESULT "))[len("RESULT "):])
        print(json.dumps(_row("fsdp", n, times, base)), flush=True)


if __name__ == "__main__":
    main()
