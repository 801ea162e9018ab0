"""What every `meshrl chain` command module shares: the command record, the configs several
commands take, the JSON-line output and the one-line report of a chain error."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

from pydantic import Field

from meshrl.config import Config
from meshrl.protocol.config import ChainConfig

__all__ = ["AmountConfig", "ChainOnly", "Command", "emit", "handled"]


class Command(NamedTuple):  # a NamedTuple: cheaper to define than a dataclass (startup)
    """One verb: its config, its action and the help line `--help` shows. `chain_errors`: a
    `ChainError` (a revert included) becomes one line on stderr and exit status 1 (`handled`);
    the commands that serve (rpc-filter) or never touch a chain (keys new) report their own."""

    name: str
    config: type[Config]
    run: Callable[[Any], int]
    help: str
    chain_errors: bool = True


class ChainOnly(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)


class AmountConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    tokens: Decimal = Field(Decimal("100"), ge=0, description="amount in whole tokens")


def emit(obj: Any) -> None:
    """One JSON line on stdout, flushed: a reader of a pipe sees it now."""
    print(json.dumps(obj, default=str), flush=True)


def handled(name: str, fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """Chain errors (reverts included) become one clear line on stderr and exit status 1."""

    def run(cfg: Any) -> int:
        from meshrl.protocol.errors import ChainError

        try:
            return fn(cfg)
        except ChainError as e:
            print(f"meshrl chain {name}: {e}", file=sys.stderr)
            return 1

    return run
