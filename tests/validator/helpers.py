"""Shared by the worker and validator tests: a tiny pool, a worker's file as the validator
reads it (through the Parquet bytes), and the chain claim of a submission."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.orchestrator.api import OrchestratorApi
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.pool import Assignment, PoolRules
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.validator.verify import ChainClaim
from meshrl.wire.guard import RequestGuard
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.wire.service import build_app
from meshrl.worker.cheats import Cheat
from meshrl.worker.config import CheatConfig
from meshrl.worker.rollouts import generate_rollouts

NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+-")])


def rules(max_new: int = 8, prompts: int = 2, group: int = 4, async_level: int = 2,
          temperature: float = 1.0, seed: int = 7, pool_id: int = 1) -> PoolRules:
    return PoolRules(pool_id=pool_id, seed=seed, async_level=async_level,
                     prompts_per_file=prompts, group_size=group, task=TASKS,
                     sampling={"max_new_tokens": max_new, "temperature": temperature,
                               "top_p": 1.0})


def assignment(r: PoolRules, step: int = 1, counter: int = 0, node: str = NODE) -> Assignment:
    return Assignment(r, node, step, counter)


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
    """A cheating worker's file of assignment(r), as the validator reads it."""
    cheat = Cheat(CheatConfig(mode=mode, **cfg))
    a = assignment(r)
    eng = engine
    state = cheat.weights(model.state_dict(), model.config, a.step)
    if state is not model.state_dict() and mode in ("other-model", "int8", "scale-layer"):
        eng = CPUEngine(model, tok, EngineConfig(num_threads=1))
        eng.load_weights(state, version=0)
    tasks = r.task.build()
    b = generate_rollouts(eng, tok, a, tasks, PROVIDER, problems=cheat.problems(a, tasks),
                          sampling=cheat.sampling(a), edit=cheat.edit(a.step, tok.eos_token_id))
    return roundtrip(cheat.finish(b))[0]


@contextlib.asynccontextmanager
async def rules_server(pool_id: int = 1, then: dict[str, Any] | None = None,
                       **published: Any) -> AsyncIterator[str]:
    """The orchestrator's own `GET /rules` route and handler on loopback, publishing the rules
    `published` (the rest of the orchestrator needs a chain; reading the rules needs none).
    With `then`, the rules changed by `then` are published from the second read on."""
    cfg = OrchestratorConfig(pool_id=pool_id, rules=published)
    orch = SimpleNamespace(cfg=cfg, rules=PoolRules(pool_id=pool_id, **dict(cfg.rules)))
    api = OrchestratorApi(orch)  # type: ignore[arg-type]
    routes = [r for r in api.routes() if r.path == "/rules"]
    if then is not None:
        later = PoolRules(pool_id=pool_id, **dict(OrchestratorConfig(
            pool_id=pool_id, rules={**published, **then}).rules))

        async def first_then_later(call: Any) -> PoolRules:
            out = await api.rules(call)
            orch.rules = later
            return out
        routes = [dataclasses.replace(r, handler=first_then_later) for r in routes]
    runner = web.AppRunner(build_app("orchestrator", routes, RequestGuard(cfg.guard)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
