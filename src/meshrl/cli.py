"""The `meshrl` command: one subcommand group per role.

Each subsystem exposes `register(subparsers)` in its own light `cli` module (no torch at import
time) so `meshrl --help` answers fast; handlers import the heavy parts when they run. Expected
failures (a bad config, a missing file, a `CommandError` a handler raises, bad input a
package refuses with an `InputError`, Ctrl-C) end in one line on stderr,
`meshrl <command>: <problem>`, and a non-zero exit; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from meshrl.config import (
    EXIT_INTERRUPTED,
    CommandError,
    ConfigError,
    Interrupted,
    load_config,
)

__all__ = ["main"]

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
    "meshrl.worker.cli",
    "meshrl.validator.cli",
    "meshrl.network.cli",
    "meshrl.dashboard.cli",
    "meshrl.adversaries.cli",
]


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
    as_program = argv is None  # the process's own command line (not a caller's test)
    argv = list(sys.argv[1:] if argv is None else argv)
    head, overrides = _split_overrides(argv)
    parser = build_parser()
    head = _two_words(parser, head)
    args, unknown = parser.parse_known_args(head)
    if getattr(args, "_handler", None) is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        parser.print_help()
        return 0 if args.command is None else 2
    pos = getattr(args, "_positional", "")
    given = [f"--{pos}", getattr(args, pos)] if pos and getattr(args, pos) is not None else []
    name = " ".join(w for w in head if not w.startswith("-") and w not in args.configs
                    and w not in given)
    try:
        cfg = load_config(args._config_cls, args.configs, given + unknown + overrides)
    except ConfigError as e:
        return _fail(name, e, 2)
    try:
        return int(args._handler(cfg) or 0)
    except Interrupted as e:
        return _interrupted(name, e, as_program)
    except CommandError as e:
        return _fail(name, e, e.exit_code)
    except OSError as e:  # missing files, permissions, ports in use
        return _fail(name, e, 1)
    except KeyboardInterrupt:  # a handler that keeps something says so with `Interrupted`
        return _interrupted(name, Interrupted(), as_program)


def _interrupted(command: str, error: Interrupted, as_program: bool) -> int:
    """The one line of a stopped command. As a program, the heap is left out of the
    interpreter's last garbage collection (atexit hooks still run): what the command keeps is
    on disk, and that collection of a trainer's heap took 2-7 s of a stop."""
    code = _fail(command, error, EXIT_INTERRUPTED)
    if as_program:
        import gc

        gc.disable()
        gc.freeze()
    return code


def _two_words(parser: argparse.ArgumentParser, head: list[str]) -> list[str]:
    """`meshrl worker join ...` is the command registered as `worker-join`: a role's command
    takes config files as its arguments, so a verb under it is a command of its own."""
    if len(head) >= 2:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if f"{head[0]}-{head[1]}" in sub.choices:
            return [f"{head[0]}-{head[1]}", *head[2:]]
    return head


def _fail(command: str, error: BaseException, code: int) -> int:
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"meshrl {command}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
