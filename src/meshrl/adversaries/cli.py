"""`meshrl adversary worker` / `meshrl adversary validator`: the honest roles with an
adversary's parts or verdict hook handed in (light imports only)."""

from __future__ import annotations

from typing import Any

from meshrl.validator.config import ValidatorConfig
from meshrl.worker.config import WorkerConfig

__all__ = ["register"]


def _worker(cfg: WorkerConfig) -> int:
    from meshrl.adversaries.worker import worker_parts
    from meshrl.worker.cli import run_worker

    return run_worker(cfg, worker_parts(cfg.cheat))


def _validator(cfg: ValidatorConfig) -> int:
    from meshrl.adversaries.validator import Rogue
    from meshrl.validator.cli import run_validator

    return run_validator(cfg, Rogue(cfg.rogue, cfg.share) if cfg.rogue.mode != "none" else None)


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "adversary-worker", WorkerConfig, _worker,
                       "meshrl adversary worker: a dishonest worker (its config's cheat.mode), "
                       "for tests and demos of the validator")
    add_config_command(subparsers, "adversary-validator", ValidatorConfig, _validator,
                       "meshrl adversary validator: a rogue validator (its config's "
                       "rogue.mode), for tests and demos of disputes")
