"""Shared by the worker and validator tests: a tiny pool, a worker's batch as the validator
reads it, and the chain claim of an honest submission."""

from __future__ import annotations

import hashlib

from meshrl.inference import SamplingParams
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.verify import ChainClaim, FileRow, FileView, PoolRules
from meshrl.worker.rollouts import Assignment, RolloutBatch

NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+-")])


def rules(max_new: int = 8, prompts: int = 2, group: int = 4, async_level: int = 2,
          temperature: float = 1.0, seed: int = 7) -> PoolRules:
    return PoolRules(seed=seed, async_level=async_level, prompts_per_file=prompts,
                     group_size=group, sampling={"max_new_tokens": max_new,
                                                 "temperature": temperature, "top_p": 1.0},
                     tasks=TASKS)


def assignment(r: PoolRules, step: int = 3, counter: int = 0, node: str = NODE) -> Assignment:
    s = r.sampling
    return Assignment(seed=r.seed, node=node, step=step, counter=counter,
                      prompts=r.prompts_per_file, group_size=r.group_size,
                      sampling=SamplingParams(max_new_tokens=s["max_new_tokens"],
                                              temperature=s["temperature"], top_p=s["top_p"]),
                      tasks=r.tasks)


def view(b: RolloutBatch) -> FileView:
    s = b.sampling
    return FileView(
        node=b.node, provider=b.provider, step=b.step, counter=b.counter,
        policy_version=b.policy_version, seed=b.seed,
        sampling={"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                  "top_p": s.top_p},
        group_size=b.group_size, work_units=b.work_units,
        rows=[FileRow(r.prompt_ids, r.token_ids, r.logprobs, r.finish_reason, r.seq_id,
                      r.reward, r.proofs) for r in b.rows])


def claim(b: RolloutBatch, units: int | None = None) -> ChainClaim:
    digest = hashlib.sha256(repr(b).encode()).hexdigest()
    return ChainClaim(digest, b.node, b.provider, b.work_units if units is None else units)
