"""The `meshrl` command: one subcommand group per role.

Each subsystem exposes `register(subparsers)` in its own light `cli` module (no torch at import
time) so `meshrl --help` answers fast; handlers import the heavy parts when they run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from meshrl.config import Config, ConfigError, config_help, load_config

__all__ = ["add_config_command", "main"]

# Subsystem CLI modules, each with `register(subparsers)`. Add a line per subsystem.
SUBSYSTEMS = [
    "meshrl.model.cli",
    "meshrl.rl.cli",
    "meshrl.shardcast.cli",
    "meshrl.protocol.cli",
    "meshrl.inference.cli",
    "meshrl.toploc.cli",
    "meshrl.discovery.cli",
    "meshrl.orchestrator.cli",
]


def add_config_command(
    subparsers: Any,
    name: str,
    config_cls: type[Config],
    handler: Callable[[Any], int | None],
    help: str,
) -> argparse.ArgumentParser:
    """A subcommand parsing TOML files + dotted overrides into `config_cls`, then `handler(cfg)`."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="options (as --dotted.key VALUE, after the config files):\n"
        + config_help(config_cls),
    )
    parser.add_argument("configs", nargs="*", help="TOML config files, merged in order")
    parser.set_defaults(_config_cls=config_cls, _handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrl", description="Decentralized asynchronous RL for language models."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBSYSTEMS:
        importlib.import_module(mod).register(sub)
    return parser


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Command words and config files come first; everything from the first `--key` is an override.

    Every subcommand takes its options as config keys, so no other `--flag` exists to confuse.
    """
    for i, arg in enumerate(argv):
        if arg.startswith("--") and arg != "--help":
            return argv[:i], argv[i:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, overrides = _split_overrides(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(head)
    if getattr(args, "_handler", None) is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if getattr(args, "func", None) is not None:
            return int(args.func(args) or 0)
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        cfg = load_config(args._config_cls, args.configs, unknown + overrides)
    except ConfigError as e:
        print(f"meshrl {args.command}: {e}", file=sys.stderr)
        return 2
    return int(args._handler(cfg) or 0)


if __name__ == "__main__":
    sys.exit(main())
