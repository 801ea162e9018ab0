"""The policy a worker generates with: the engine, its version, and how new versions arrive.

Version 0 is the model directory in the config when the pool names no shardcast servers;
otherwise the newest version the work order allows is fetched (verified, atomic) and later
versions are followed and hot-loaded into the running engine. A cheat that changes weights is
applied here, when its step comes, so the rest of the worker is the honest code path.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshrl.inference import InferenceBackend
from meshrl.log import get_logger, log_event
from meshrl.pool import Assignment, WorkOrder
from meshrl.tasks import TaskSet
from meshrl.wire.rollout_file import RolloutFile
from meshrl.worker.cheats import WEIGHT_CHEATS, Cheat
from meshrl.worker.config import WorkerConfig
from meshrl.worker.rollouts import generate_rollouts

__all__ = ["PolicyHolder"]

log = get_logger("meshrl.worker")


def _backend(cfg: WorkerConfig, model: Any, tokenizer: Any, version: int) -> InferenceBackend:
    if cfg.backend == "reference":
        import torch

        from meshrl.inference.reference import ReferenceBackend

        return ReferenceBackend(model.to(getattr(torch, cfg.dtype)), tokenizer, cfg.reference,
                                version)
    from meshrl.inference import CPUEngine

    engine = CPUEngine(model, tokenizer, cfg.engine)
    engine.load_weights(model.state_dict(), version)
    return engine


class PolicyHolder:
    """The engine and the honest weights of its current version (one lock around swaps)."""

    def __init__(self, cfg: WorkerConfig, cheat: Cheat, model_dir: Path, version: int) -> None:
        from meshrl.model import load_model, load_tokenizer

        self.cfg, self.cheat = cfg, cheat
        model = load_model(model_dir)
        self.model_config = model.config
        self.tokenizer = load_tokenizer(model_dir)
        self.engine = _backend(cfg, model, self.tokenizer, version)
        # the reference backend runs `model` itself: a weight cheat loaded into it must not
        # overwrite the honest weights kept here
        self.honest: dict[str, Any] = {k: v.detach().clone() if cfg.backend == "reference"
                                       else v for k, v in model.state_dict().items()}
        self.version = version
        self.cheating = False
        self.lock = threading.Lock()

    @classmethod
    async def start(cls, cfg: WorkerConfig, order: WorkOrder, cheat: Cheat) -> PolicyHolder:
        if not order.shardcast_servers:
            if not cfg.model_dir:
                raise ValueError("worker: the pool has no shardcast servers; set model_dir")
            return await asyncio.to_thread(cls, cfg, cheat, Path(cfg.model_dir), 0)
        from meshrl.shardcast import ShardcastClient

        out = Path(cfg.work_dir) / "policy"
        async with ShardcastClient(order.shardcast_servers) as sc:
            res = await sc.fetch(out / f"v{max(order.policy_versions)}",
                                 max(order.policy_versions))
        return await asyncio.to_thread(cls, cfg, cheat, res.path, res.version)

    def load(self, model_dir: Path, version: int) -> None:
        """Hot-load a new version (generation in another thread keeps its consistent weights)."""
        from meshrl.model import load_model

        state = load_model(model_dir).state_dict()
        with self.lock:
            self.engine.load_weights(state, version)
            # published only once the weights are in: `version` is what readers trust
            self.honest, self.version, self.cheating = state, version, False
        log_event(log, "policy loaded", version=version)

    def _weights_for(self, step: int) -> None:
        want = self.cheat.active(step) and self.cheat.cfg.mode in WEIGHT_CHEATS
        if want != self.cheating:
            state = self.cheat.weights(self.honest, self.model_config, step) if want \
                else self.honest
            self.engine.load_weights(state, self.version)
            self.cheating = want

    def generate(self, a: Assignment, tasks: TaskSet, provider: str) -> RolloutFile:
        with self.lock:
            self._weights_for(a.step)
            c = self.cheat
            return generate_rollouts(self.engine, self.tokenizer, a, tasks, provider,
                                     problems=c.problems(a, tasks), sampling=c.sampling(a),
                                     edit=c.edit(a.step, self.tokenizer.eos_token_id))

    async def follow(self, servers: list[str], step: Callable[[], int],
                     stop: asyncio.Event) -> None:
        """Fetch and hot-load each new version from shardcast until `stop`."""
        if not servers:
            return
        from meshrl.shardcast import ShardcastClient

        async def on_version(res: Any) -> None:
            if self.cheat.frozen_version(step()):
                return
            await asyncio.to_thread(self.load, res.path, res.version)

        async with ShardcastClient(servers) as sc:
            await sc.follow(Path(self.cfg.work_dir) / "policy", on_version, after=self.version,
                            stop=stop)
