"""`meshrl discovery CONFIG.toml [--key value ...]`: the node registry."""

from __future__ import annotations

from typing import Any

from meshrl.discovery.config import DiscoveryConfig

__all__ = ["register"]


def _run(cfg: DiscoveryConfig) -> int:
    import asyncio
    import contextlib

    from meshrl.discovery.service import Discovery
    from meshrl.protocol.local import open_protocol

    async def main() -> None:
        service = Discovery(cfg, open_protocol(cfg.chain, signer=False))
        await service.start()
        try:
            await asyncio.Event().wait()
        finally:
            await service.stop()

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

    add_config_command(subparsers, "discovery", DiscoveryConfig, _run,
                       help="the node registry: announcements, pool candidates, chain status")
