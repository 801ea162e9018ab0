"""Run by test_distributed.py under `torchrun --nproc-per-node 2`: FSDP2 steps on fixed batches.

For each scenario every rank takes its share of the same batch (`rank_share`), steps twice with
`FSDPTrainer.train_share`, and rank 0 saves the metrics and the gathered weights to
`<out>/<name>.pt`; the test repeats the steps with the single-process `Trainer`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from meshrl.model import CharTokenizer, build_model
from meshrl.rl.config import DistributedConfig, LossConfig, TrainerConfig

# name -> (groups, micro_batch_size, dist settings); 3 groups over 2 ranks with micro-batches of
# 4 gives one rank 1 micro-batch and the other 2 (padding); 1 group leaves a rank idle
SCENARIOS = {
    "even": (4, 128, {}),
    "uneven": (3, 4, {}),
    "idle_rank": (1, 128, {}),
    "activation_checkpointing": (4, 8, {"activation_checkpointing": True}),
    "zero2": (4, 8, {"reshard_after_forward": False}),
    "bf16": (4, 128, {"mixed_precision": "bf16"}),
}
GROUP_SIZE = 4
STEPS = 2
TOK = CharTokenizer()


def make_batch(groups: int, seed: int = 0):
    """Rows of `groups` groups: prompt, completion, inference log-probs, advantage (seeded)."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions, logprobs = [], [], []
    for _ in range(groups):
        prompt = [1, *torch.randint(3, TOK.vocab_size, (5,), generator=g).tolist()]
        for _ in range(GROUP_SIZE):
            n = int(torch.randint(1, 5, (1,), generator=g))
            completions.append(torch.randint(3, TOK.vocab_size, (n,), generator=g).tolist())
            logprobs.append((-torch.rand(n, generator=g) * 3).tolist())
            prompts.append(prompt)
    advantages = torch.randn(groups * GROUP_SIZE, generator=g)
    return prompts, completions, logprobs, advantages


def trainer_config(micro_batch_size: int) -> TrainerConfig:
    return TrainerConfig(lr=1e-2, warmup_steps=0, micro_batch_size=micro_batch_size)


def model():
    return build_model("qwen2-tiny", TOK.vocab_size, seed=0)


def run(world, name: str, out: Path) -> None:
    from meshrl.rl.dist_run import gather_full
    from meshrl.rl.distributed import FSDPTrainer, rank_share, shard_policy
    from meshrl.rl.packing import pack_groups

    groups, mbs, dist_settings = SCENARIOS[name]
    policy = shard_policy(model(), world, DistributedConfig(**dist_settings), 1.0)
    trainer = FSDPTrainer(policy, world, trainer_config(mbs), LossConfig())
    prompts, completions, logprobs, adv = make_batch(groups)
    mine = list(rank_share(groups, world.rank, world.size))
    idx = [g * GROUP_SIZE + j for g in (mine or [0]) for j in range(GROUP_SIZE)]
    share = pack_groups([prompts[i] for i in idx], [completions[i] for i in idx],
                        [logprobs[i] for i in idx], TOK.pad_token_id)
    stats = [trainer.train_share(share, adv[idx], total_rows=len(adv), idle=not mine)
             for _ in range(STEPS)]
    weights = gather_full(world, trainer.model.state_dict())
    if world.is_main:
        torch.save({"stats": stats, "weights": weights}, out / f"{name}.pt")


def main() -> None:
    from meshrl.rl.distributed import init_world

    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    world = init_world(DistributedConfig(), os.environ)
    try:
        for name in SCENARIOS:
            run(world, name, out)
    except BaseException:
        world.close(wait_for_peers=False)
        raise
    world.close()


if __name__ == "__main__":
    main()
