"""`meshrl worker` (light imports only: torch loads after the command line is parsed)."""

from __future__ import annotations

from typing import Any

from meshrl.worker.config import WorkerConfig

__all__ = ["register"]


def _worker(cfg: WorkerConfig) -> int:
    import asyncio

    from meshrl.config import EXIT_REFUSED, CommandError
    from meshrl.pool import PoolRulesError
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import connect
    from meshrl.wire import WireHTTPError
    from meshrl.worker.keys import KeystoreError, load_keys
    from meshrl.worker.node import HardwareError, WorkerNode
    from meshrl.worker.onboard import Blacklisted, OnboardError

    try:
        keys = load_keys(cfg.keys, connect(cfg.chain).chain_id)
        return asyncio.run(WorkerNode(cfg, keys).run())
    except (Blacklisted, PoolRulesError) as e:  # for good: a supervisor must not restart it
        raise CommandError(str(e), EXIT_REFUSED) from None
    except (KeystoreError, HardwareError, ChainError, OnboardError, WireHTTPError) as e:
        raise CommandError(str(e)) from None  # one line, not a traceback


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "worker", WorkerConfig, _worker,
                       "generate verified rollouts for a compute pool and earn its rewards")
