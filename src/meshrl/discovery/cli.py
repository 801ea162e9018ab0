"""`meshrl discovery CONFIG.toml [--key value ...]`: the node registry."""

from __future__ import annotations

from typing import Any

from meshrl.discovery.config import DiscoveryConfig

__all__ = ["register"]


def _run(cfg: DiscoveryConfig) -> int:
    from meshrl.discovery.service import Discovery
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol
    from meshrl.wire.service import serve_forever

    # no deployment, unreachable chain: one line, not a traceback
    return serve_forever(lambda: Discovery(cfg, open_protocol(cfg.chain, signer=False)),
                         errors=(ChainError,))


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "discovery", DiscoveryConfig, _run,
                       help="the node registry: announcements, pool candidates, chain status")
