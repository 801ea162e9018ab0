"""`meshrl worker` (light imports only: torch loads after the command line is parsed)."""

from __future__ import annotations

from typing import Any

from meshrl.worker.config import WorkerConfig

__all__ = ["register"]


def _worker(cfg: WorkerConfig) -> int:
    import asyncio

    from meshrl.config import CommandError
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import connect
    from meshrl.worker.keys import KeystoreError, load_keys
    from meshrl.worker.node import HardwareError, WorkerNode
    from meshrl.worker.profile import PoolRulesError

    try:
        keys = load_keys(cfg.keys, connect(cfg.chain).chain_id)
        return asyncio.run(WorkerNode(cfg, keys).run())
    except (KeystoreError, HardwareError, ChainError, PoolRulesError) as e:  # one line
        raise CommandError(str(e)) from None


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "worker", WorkerConfig, _worker,
                       "generate verified rollouts for a compute pool and earn its rewards")
