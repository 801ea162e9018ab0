"""`meshrl network up CONFIG`: the whole system on loopback, supervised."""

from __future__ import annotations

from typing import Any

from meshrl.network.config import NetworkConfig

__all__ = ["register"]


def _up(cfg: NetworkConfig) -> int:
    from meshrl.network.up import network_up

    return network_up(cfg)


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("network", help="a whole pool on this machine, supervised")
    sub = group.add_subparsers(dest="network_command", metavar="ACTION", required=True)
    add_config_command(sub, "up", NetworkConfig, _up,
                       "start anvil, services, shardcast, trainer, validator and workers; "
                       "supervise until the trainer finishes (Ctrl-C stops, `up` again resumes)")
