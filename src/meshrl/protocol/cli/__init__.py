"""`meshrl chain ...` and `meshrl keys ...`: run a local chain, deploy, and the main protocol
actions from a shell.

Each module here holds one group of verbs, each verb's config beside its few lines of action:
`deploy` (node, devnet, deploy, status, rpc-filter, compile), `funds` (register, stake, send,
balances), `admin` (mint, create-pool, the federator's hand-over), `rewards` (works, rewards,
claim), `disputes` (disputes, challenge, vote, settle) and `keys` (keys new). They import only
configs: web3 and the chain client load inside a command when it runs, so `--help` and the
parser stay fast (a network's stop report runs `meshrl chain works`).
"""

from __future__ import annotations

from typing import Any

from meshrl.config import add_config_command
from meshrl.protocol.cli import admin, deploy, disputes, funds, keys, rewards
from meshrl.protocol.cli.common import Command, handled

__all__ = ["register"]

# The order `meshrl chain --help` lists the verbs in.
CHAIN_VERBS = (
    "node", "devnet", "deploy", "status", "register", "stake", "mint", "create-pool",
    "propose-federator", "accept-federator", "balances", "works", "disputes", "challenge",
    "vote", "settle", "rpc-filter", "send", "rewards", "claim", "compile",
)


def _add(sub: Any, command: Command) -> None:
    run = handled(command.name, command.run) if command.chain_errors else command.run
    add_config_command(sub, command.name, command.config, run, command.help)


def register(subparsers: Any) -> None:
    keys_group = subparsers.add_parser("keys", help="key files: encrypted keystores")
    keys_sub = keys_group.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    for command in keys.COMMANDS:
        _add(keys_sub, command)
    chain = {c.name: c for m in (deploy, funds, admin, rewards, disputes) for c in m.COMMANDS}
    if set(chain) != set(CHAIN_VERBS):  # a verb added to a module must be given its place
        raise RuntimeError(f"meshrl chain: verbs {sorted(set(chain) ^ set(CHAIN_VERBS))} are "
                           "not both in a command module and in CHAIN_VERBS")
    group = subparsers.add_parser("chain", help="protocol contracts: local chain, deploy, act")
    sub = group.add_subparsers(dest="chain_command", metavar="ACTION", required=True)
    for name in CHAIN_VERBS:
        _add(sub, chain[name])
