"""Rollout files for tests: a small valid file built from seeded random values."""

from __future__ import annotations

import random

from meshrl.wire.rollout_file import Completion, RolloutFile, RolloutHeader

NODE = "0x" + "12" * 20
PROVIDER = "0x" + "34" * 20


def sample_rollout(n_prompts: int = 2, group: int = 3, seed: int = 0, topk: int = 4,
                   tokens: int = 9) -> RolloutFile:
    rng = random.Random(seed)
    header = RolloutHeader(
        node=NODE, provider=PROVIDER, pool_id=1, policy_version=4,
        rules_sha256="ab" * 32, sampling_seed=77, toploc_chunk_size=4, toploc_topk=topk,
        work_units=n_prompts * group * tokens,
    )
    comps = [
        Completion(
            prompt_id=f"arithmetic/{p}", counter=p, sample_index=g, seq_id=p * group + g,
            prompt_tokens=[rng.randrange(100) for _ in range(5)],
            completion_tokens=[rng.randrange(100) for _ in range(tokens)],
            logprobs=[-rng.random() for _ in range(tokens)],
            reward=float(rng.random() > 0.5),
            finish_reason="length",
            toploc_proofs=[rng.randbytes(2 + 2 * topk) for _ in range(tokens // 4)],
        )
        for p in range(n_prompts) for g in range(group)
    ]
    return RolloutFile(header, comps)
