"""`meshrl orchestrator CONFIG.toml [--key value ...]`: serve one compute pool."""

from __future__ import annotations

from typing import Any

from meshrl.orchestrator.config import OrchestratorConfig

__all__ = ["register"]


def _run(cfg: OrchestratorConfig) -> int:
    import asyncio
    import contextlib

    from meshrl.orchestrator.service import Orchestrator
    from meshrl.protocol.local import open_protocol

    async def main() -> None:
        orch = Orchestrator(cfg, open_protocol(cfg.chain))
        await orch.start()
        try:
            await asyncio.Event().wait()
        finally:
            await orch.stop()

    from meshrl.config import CommandError
    from meshrl.protocol.errors import ChainError

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    except ChainError as e:  # no deployment, unreachable chain: one line, not a traceback
        raise CommandError(str(e)) from e
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "orchestrator", OrchestratorConfig, _run,
                       help="serve one compute pool: onboarding, heartbeats, work, uploads, "
                            "ledger")
