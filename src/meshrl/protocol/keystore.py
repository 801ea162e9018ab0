"""Key files: eth-account keystores (scrypt / pbkdf2 encrypted JSON) and plain hex key files.

A key never travels on a command line (it would show in `ps` and in shell history): roles read
it from a file. A keystore's password comes from a file or an environment variable, or, for a
person at a terminal, from a prompt (`meshrl keys new`). A plain hex key file (one line, mode
0600) is for development networks, whose keys are public anyway; one readable by group or
others is refused.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

__all__ = [
    "KeystoreError",
    "decrypt_keystore",
    "load_key_file",
    "read_password",
    "write_key_file",
    "write_keystore",
]


class KeystoreError(ValueError):
    """A key that cannot be loaded: missing file, no password, wrong password, bad keystore."""


def read_password(password_file: str, password_env: str,
                  env: Mapping[str, str] | None = None) -> str:
    """The password in `password_file` (trailing newline dropped), else in `$password_env`."""
    if password_file:
        path = Path(password_file)
        if not path.is_file():
            raise KeystoreError(f"keys: password file {path} not found")
        return path.read_text().rstrip("\r\n")
    env = os.environ if env is None else env
    if password_env and password_env in env:
        return env[password_env]
    raise KeystoreError(f"keys: no password: set ${password_env} or a password file")


def decrypt_keystore(path_text: str, password: str, what: str = "") -> LocalAccount:
    """The account in keystore `path_text`; `what` names it in errors ("provider", ...)."""
    what = f"{what} " if what else ""
    path = Path(path_text)
    if not path_text or not path.is_file():
        raise KeystoreError(f"keys: {what}keystore {path_text or '(not set)'} not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KeystoreError(f"keys: {what}keystore {path} is not JSON ({e})") from None
    try:
        return Account.from_key(Account.decrypt(data, password))
    except ValueError as e:  # eth-account raises ValueError for a wrong password (MAC mismatch)
        raise KeystoreError(f"keys: cannot decrypt the {what}keystore {path}: {e}") from None
    except (KeyError, TypeError) as e:
        raise KeystoreError(f"keys: {what}keystore {path} is malformed ({e})") from None


def _private_file(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: set it
    return fd


def write_keystore(account: LocalAccount, password: str, path: str | Path,
                   iterations: int | None = None) -> Path:
    """Encrypt `account` to a keystore file readable only by its owner (scrypt by default;
    `iterations`: pbkdf2 with that many rounds, fast, for tests)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kdf = {} if iterations is None else {"kdf": "pbkdf2", "iterations": iterations}
    data = Account.encrypt(account.key, password, **kdf)
    with os.fdopen(_private_file(path), "w") as f:
        json.dump(data, f)
    return path


def write_key_file(account: LocalAccount, path: str | Path) -> Path:
    """The key as one hex line in a file only its owner reads (development networks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(_private_file(path), "w") as f:
        f.write("0x" + bytes(account.key).hex() + "\n")
    return path


def load_key_file(path_text: str, password_file: str = "", password_env: str = "",
                  env: Mapping[str, str] | None = None) -> LocalAccount:
    """The account in `path_text`: a keystore (JSON; password from the file or the env) or a
    plain hex key readable by its owner only."""
    path = Path(path_text)
    if not path.is_file():
        raise KeystoreError(f"keys: key file {path_text} not found")
    text = path.read_text().strip()
    if text.startswith("{"):
        return decrypt_keystore(path_text, read_password(password_file, password_env, env))
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeystoreError(f"keys: key file {path} is readable by others: chmod 600 it")
    try:
        return Account.from_key(text)
    except (ValueError, TypeError) as e:
        raise KeystoreError(f"keys: {path} holds neither a keystore nor a hex key ({e})") \
            from None
