"""Shared by the worker and validator tests: a tiny pool, a worker's file as the validator
reads it (through the Parquet bytes), and the chain claim of a submission."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from meshrl.adversaries.worker import WEIGHT_CHEATS, worker_parts
from meshrl.inference import CPUEngine, EngineConfig
from meshrl.orchestrator.api import OrchestratorApi
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.pool import Assignment, PoolRules
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.verify import ChainClaim
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.worker.config import CheatConfig
from meshrl.worker.rollouts import generate_rollouts
from orchestrator.parts import api_from_parts  # tests/ is on sys.path

NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+-")])


def rules(max_new: int = 8, prompts: int = 2, group: int = 4, async_level: int = 2,
          temperature: float = 1.0, seed: int = 7, pool_id: int = 1) -> PoolRules:
    return PoolRules(pool_id=pool_id, seed=seed, async_level=async_level,
                     prompts_per_file=prompts, group_size=group, task=TASKS,
                     sampling={"max_new_tokens": max_new, "temperature": temperature,
                               "top_p": 1.0})


def assignment(r: PoolRules, counter: int = 0, node: str = NODE,
               version: int = 0) -> Assignment:
    """The work of (node, counter) at policy version `version`."""
    return Assignment(r, node, counter, version)


def roundtrip(rf: RolloutFile) -> tuple[RolloutFile, str]:
    """The file as a validator downloads it, and its sha256."""
    data = rollout_file_bytes(rf)
    return read_rollout_file(data), hashlib.sha256(data).hexdigest()


def claim(rf: RolloutFile, sha: str = "00" * 32, units: int | None = None) -> ChainClaim:
    h = rf.header
    return ChainClaim(sha, h.node, h.provider, h.work_units if units is None else units)


def honest_file(engine: Any, tok: Any, r: PoolRules, **at: Any) -> RolloutFile:
    """An honest worker's file of assignment(r, **at), as the validator reads it."""
    return roundtrip(generate_rollouts(engine, tok, assignment(r, **at), r.task.build(),
                                       PROVIDER))[0]


def cheat_file(engine: Any, model: Any, tok: Any, r: PoolRules, mode: str,
               **cfg: Any) -> RolloutFile:
    """A cheating worker's file of assignment(r), as the validator reads it: generated with the
    worker's parts for cheat `mode` (`meshrl.adversaries.worker`) around `engine` (`model`'s
    weights), or around an engine of its own for a cheat that loads other weights."""
    parts = worker_parts(CheatConfig(mode=mode, **cfg))
    if mode in WEIGHT_CHEATS:
        engine = CPUEngine(model, tok, EngineConfig(num_threads=1))
    rf = parts.rollouts(parts.backend(engine, model, tok, 0), tok, assignment(r), r.task.build(),
                        PROVIDER)
    return roundtrip(rf)[0]


class _RulesThatChange(OrchestratorApi):
    """The orchestrator's API whose published rules become `later` after the first read."""

    later: PoolRules | None = None

    async def rules(self, call: Any) -> PoolRules:
        out = self.published
        if self.later is not None:
            self.published = self.later
        return out


@contextlib.asynccontextmanager
async def rules_server(pool_id: int = 1, then: dict[str, Any] | None = None,
                       **published: Any) -> AsyncIterator[str]:
    """The orchestrator's own API on loopback, built from its parts, publishing the rules
    `published` at `GET /rules` (the rest of the orchestrator needs a chain; reading the rules
    needs none). With `then`, the rules changed by `then` are published from the second read
    on."""
    cfg = OrchestratorConfig(pool_id=pool_id, rules=published)
    with tempfile.TemporaryDirectory() as tmp:
        async with api_from_parts(Path(tmp), cfg, api_type=_RulesThatChange) as served:
            if then is not None:
                served.api.later = PoolRules(pool_id=pool_id, **dict(OrchestratorConfig(  # type: ignore[attr-defined]
                    pool_id=pool_id, rules={**published, **then}).rules))
            yield served.url
