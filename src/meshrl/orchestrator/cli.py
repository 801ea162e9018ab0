"""`meshrl orchestrator CONFIG.toml [--key value ...]`: serve one compute pool."""

from __future__ import annotations

from typing import Any

from meshrl.orchestrator.config import OrchestratorConfig

__all__ = ["register"]


def _run(cfg: OrchestratorConfig) -> int:
    from meshrl.orchestrator.service import Orchestrator
    from meshrl.orchestrator.state import LedgerUnreadable, State
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol
    from meshrl.wire.service import serve_forever

    def make() -> Orchestrator:
        state = State(cfg.db)  # a ledger it cannot read stops the start before the chain is asked
        return Orchestrator(cfg, open_protocol(cfg.chain), state=state)

    # no deployment, unreachable chain, an unreadable ledger: one line, not a traceback
    return serve_forever(make, errors=(ChainError, LedgerUnreadable))


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "orchestrator", OrchestratorConfig, _run,
                       help="serve one compute pool: onboarding, heartbeats, work, uploads, "
                            "ledger")
