"""Shared by the worker and validator tests: a tiny pool, a worker's file as the validator
reads it (through the Parquet bytes), and the chain claim of a submission."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.verify import ChainClaim, PoolRules
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.worker.cheats import Cheat
from meshrl.worker.config import CheatConfig
from meshrl.worker.rollouts import Assignment, generate_rollouts
from orchestrator.parts import api_from_parts  # tests/ is on sys.path

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


def cheat_file(engine: Any, model: Any, tok: Any, r: PoolRules, mode: str,
               **cfg: Any) -> RolloutFile:
    """A cheating worker's file of assignment(r), as the validator reads it."""
    cheat = Cheat(CheatConfig(mode=mode, **cfg))
    a = assignment(r)
    eng = engine
    state = cheat.weights(model.state_dict(), model.config, a.step)
    if state is not model.state_dict() and mode in ("other-model", "int8", "scale-layer"):
        eng = CPUEngine(model, tok, EngineConfig(num_threads=1))
        eng.load_weights(state, version=0)
    b = generate_rollouts(eng, tok, a, PROVIDER, problems=cheat.problems(a),
                          sampling=cheat.sampling(a), edit=cheat.edit(a.step, tok.eos_token_id))
    return roundtrip(cheat.finish(b))[0]


@contextlib.asynccontextmanager
async def rules_server(pool_id: int = 1, **work: Any) -> AsyncIterator[str]:
    """The orchestrator's own API on loopback, built from its parts, publishing `work` at
    `GET /rules` (the rest of the orchestrator needs a chain; reading the rules needs none)."""
    cfg = OrchestratorConfig(pool_id=pool_id, work=work)
    with tempfile.TemporaryDirectory() as tmp:
        async with api_from_parts(Path(tmp), cfg) as served:
            yield served.url
