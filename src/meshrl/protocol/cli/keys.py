"""`meshrl keys new`: encrypted keystores for a contributor; no chain is touched."""

from __future__ import annotations

import sys
from typing import Any

from pydantic import Field

from meshrl.config import Config
from meshrl.protocol.cli.common import Command, emit

__all__ = ["COMMANDS"]


class KeysNewConfig(Config):
    """`meshrl keys new`: encrypted keystores for a contributor (provider and node by default)."""

    dir: str = Field("keys", description="directory the keystores are written to")
    names: list[str] = Field(["provider", "node"], min_length=1,
                             description="one keystore <dir>/<name>.json per name")
    password_file: str = Field("", description="file holding the password (default: a prompt "
                               "at the terminal, asked twice; never on the command line)")
    force: bool = Field(False, description="overwrite existing keystores (their keys are lost)")
    kdf_iterations: int = Field(0, ge=0, description="tests only: pbkdf2 with this many rounds "
                                "instead of scrypt (0: scrypt)")


def _password(cfg: KeysNewConfig) -> str:
    """From --password_file, else asked twice at the terminal; never empty."""
    import getpass

    from meshrl.config import CommandError
    from meshrl.protocol.keystore import KeystoreError, read_password

    if cfg.password_file:
        try:
            password = read_password(cfg.password_file, "")
        except KeystoreError as e:
            raise CommandError(str(e)) from None
    elif sys.stdin.isatty():
        password = getpass.getpass("keystore password: ")
        if password != getpass.getpass("again: "):
            raise CommandError("keys new: the passwords differ")
    else:
        raise CommandError("keys new: no terminal to ask a password at: give --password_file")
    if not password:
        raise CommandError("keys new: an empty password protects nothing")
    return password


def _keys_new(cfg: KeysNewConfig) -> int:
    from pathlib import Path

    from eth_account import Account

    from meshrl.config import CommandError
    from meshrl.protocol.keystore import write_keystore

    paths = {n: Path(cfg.dir) / f"{n}.json" for n in cfg.names}
    if len(paths) != len(cfg.names) or any(not n or "/" in n for n in cfg.names):
        raise CommandError("keys new: names must be distinct file names")
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not cfg.force:
        raise CommandError(f"keys new: {', '.join(existing)} exist (--force overwrites them, "
                           "and their keys are lost)")
    password = _password(cfg)
    out: dict[str, Any] = {}
    for name, path in paths.items():
        account = Account.create()
        write_keystore(account, password, path, cfg.kdf_iterations or None)
        out[name] = {"address": account.address, "keystore": str(path)}
    emit(out)
    return 0


COMMANDS = (
    Command("new", KeysNewConfig, _keys_new,
            "new keys in encrypted keystores (provider and node by default); the password from "
            "a prompt or --password_file, never the command line", chain_errors=False),
)
