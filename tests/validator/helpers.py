"""Shared by the worker and validator tests: a tiny pool, a worker's file as the validator
reads it (through the Parquet bytes), and the chain claim of a submission."""

from __future__ import annotations

import hashlib

from meshrl.inference import SamplingParams
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.verify import ChainClaim, PoolRules
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.worker.rollouts import Assignment

NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+-")])


def rules(max_new: int = 8, prompts: int = 2, group: int = 4, async_level: int = 2,
          temperature: float = 1.0, seed: int = 7) -> PoolRules:
    return PoolRules(seed=seed, async_level=async_level, prompts_per_file=prompts,
                     group_size=group, sampling={"max_new_tokens": max_new,
                                                 "temperature": temperature, "top_p": 1.0},
                     tasks=TASKS)


def assignment(r: PoolRules, step: int = 1, counter: int = 0, node: str = NODE) -> Assignment:
    s = r.sampling
    return Assignment(seed=r.seed, node=node, pool_id=1, step=step, counter=counter,
                      prompts=r.prompts_per_file, group_size=r.group_size,
                      sampling=SamplingParams(max_new_tokens=s["max_new_tokens"],
                                              temperature=s["temperature"], top_p=s["top_p"]),
                      tasks=r.tasks)


def roundtrip(rf: RolloutFile) -> tuple[RolloutFile, str]:
    """The file as a validator downloads it, and its sha256."""
    data = rollout_file_bytes(rf)
    return read_rollout_file(data), hashlib.sha256(data).hexdigest()


def claim(rf: RolloutFile, sha: str = "00" * 32, units: int | None = None) -> ChainClaim:
    h = rf.header
    return ChainClaim(sha, h.node, h.provider, h.work_units if units is None else units)
