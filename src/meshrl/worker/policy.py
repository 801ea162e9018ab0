"""The policy a worker generates with: the engine, its version, and how new versions arrive.

Version 0 is the model directory in the config when the pool names no shardcast servers;
otherwise the newest version the work order allows is fetched (verified, atomic, its manifest
signed by the rules' `policy_signer`: no other is believed, and a pool whose rules name none is
refused) and later versions are followed and hot-loaded into the running engine. The engine
and the rollouts of an assignment are the worker's `Parts` (honest, or wrapped by a cheat:
`meshrl/adversaries/worker.py`).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from meshrl.inference import InferenceBackend
from meshrl.log import get_logger, log_event
from meshrl.pool import Assignment, PoolRulesError, PromptFormatError, WorkOrder, uses_chat
from meshrl.tasks import TaskSet
from meshrl.wire.detached import detached
from meshrl.wire.rollout_file import RolloutFile
from meshrl.worker.config import WorkerConfig
from meshrl.worker.parts import Parts

__all__ = ["PolicyHolder", "VersionMoved"]

log = get_logger("meshrl.worker")


def _backend(cfg: WorkerConfig, model: Any, tokenizer: Any, version: int) -> InferenceBackend:
    if cfg.backend == "reference":
        from meshrl.inference.device import place
        from meshrl.inference.reference import ReferenceBackend

        return ReferenceBackend(place(model, cfg.device, cfg.dtype), tokenizer, cfg.reference,
                                version)
    from meshrl.inference import engine_or_reference

    # a model the fast engine cannot run (its reason logged) runs on the reference backend
    return engine_or_reference(model, tokenizer, cfg.engine, cfg.reference, version)


def policy_signer(order: WorkOrder) -> str:
    """The address policy versions must be signed by; refused (`PoolRulesError`, for good) when
    the pool's rules name none: no version could be told from a relay's forgery."""
    if order.rules.policy_signer is None:
        raise PoolRulesError("refusing to fetch policy versions: the pool's rules name no "
                             "policy_signer, so no version can be authenticated")
    return order.rules.policy_signer


class VersionMoved(RuntimeError):
    """The policy version changed between making an assignment and generating it."""


class PolicyHolder:
    """The engine and its current version (one lock around swaps)."""

    def __init__(self, cfg: WorkerConfig, model_dir: Path, version: int,
                 parts: Parts | None = None) -> None:
        from meshrl.model import load_model, load_tokenizer

        parts = parts or Parts()
        self.cfg = cfg
        model = load_model(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.engine = parts.backend(_backend(cfg, model, self.tokenizer, version), model,
                                    self.tokenizer, version)
        self.rollouts = parts.rollouts
        self.version = version
        self.lock = threading.Lock()
        self.signer: str | None = None  # the policy signer of the pool's rules
        self.run: str | None = None  # the run id its manifests name (the pool's rules)
        self.loaded = asyncio.Event()  # set on each hot-load: an idle node asks for work again
        self.sync: Any = None  # the follower's client: sync_failures, sync_error

    @classmethod
    async def start(cls, cfg: WorkerConfig, order: WorkOrder,
                    parts: Parts | None = None) -> PolicyHolder:
        if not order.shardcast_servers:
            if not cfg.model_dir:
                raise ValueError("worker: the pool has no shardcast servers; set model_dir")
            holder = await asyncio.to_thread(cls, cfg, Path(cfg.model_dir), 0, parts)
            holder.check_prompt_format(order)
            return holder
        from meshrl.shardcast import ShardcastClient

        signer = policy_signer(order)
        out = Path(cfg.work_dir) / "policy"
        async with ShardcastClient(order.shardcast_servers, publisher=signer,
                                   run=order.rules.policy_run()) as sc:
            res = await sc.fetch(out / f"v{max(order.policy_versions)}",
                                 max(order.policy_versions))
        holder = await asyncio.to_thread(cls, cfg, res.path, res.version, parts)
        holder.signer, holder.run = signer, order.rules.policy_run()
        holder.check_prompt_format(order)
        return holder

    def check_prompt_format(self, order: WorkOrder) -> None:
        """Refused for good (`PoolRulesError`) when the rules' `prompt_format` asks for a chat
        template the policy's tokenizer lacks: no prompt of this pool could be encoded."""
        try:
            uses_chat(self.tokenizer, order.rules.prompt_format)
        except PromptFormatError as e:
            raise PoolRulesError(f"refusing to start: {e}") from e

    def load(self, model_dir: Path, version: int) -> None:
        """Hot-load a new version (generation in another thread keeps its consistent weights).
        The files are read outside the lock, so generation waits only for the swap."""
        from meshrl.model import read_weights

        state = read_weights(model_dir)
        with self.lock:
            self.engine.load_weights(state, version)
            self.version = version  # published only once the weights are in: readers trust it
        log_event(log, "policy loaded", version=version)

    def generate(self, a: Assignment, tasks: TaskSet, provider: str) -> RolloutFile:
        """The file of `a`; `VersionMoved` if a hot-load since `a` was made replaced its policy
        version (the version is part of the work: its problems are another version's)."""
        with self.lock:
            if self.version != a.policy_version:
                raise VersionMoved(f"version {self.version} loaded, the assignment is for "
                                   f"{a.policy_version}")
            return self.rollouts(self.engine, self.tokenizer, a, tasks, provider)

    async def follow(self, servers: list[str], stop: asyncio.Event) -> None:
        """Fetch and hot-load each new version from shardcast until `stop`."""
        if not servers:
            return
        from meshrl.shardcast import ClientConfig, ShardcastClient

        async def on_version(res: Any) -> None:
            await detached(self.load, res.path, res.version)
            self.loaded.set()

        cfg = ClientConfig(sync_timeout=self.cfg.policy_sync_timeout_s)
        async with ShardcastClient(servers, cfg, publisher=self.signer, run=self.run) as sc:
            self.sync = sc  # a delta against the version held is fetched as the delta alone
            await sc.follow(Path(self.cfg.work_dir) / "policy", on_version, after=self.version,
                            stop=stop)
