"""`meshrl orchestrator CONFIG.toml [--key value ...]`: serve one compute pool."""

from __future__ import annotations

from typing import Any

from meshrl.orchestrator.config import OrchestratorConfig

__all__ = ["register"]


def _run(cfg: OrchestratorConfig) -> int:
    from meshrl.orchestrator.service import Orchestrator
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol
    from meshrl.wire.service import serve_forever

    # no deployment, unreachable chain: one line, not a traceback
    return serve_forever(lambda: Orchestrator(cfg, open_protocol(cfg.chain)), errors=(ChainError,))


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "orchestrator", OrchestratorConfig, _run,
                       help="serve one compute pool: onboarding, heartbeats, work, uploads, "
                            "ledger")
