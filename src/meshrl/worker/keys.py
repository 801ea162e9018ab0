"""The worker's two keys: the provider key (stakes, adds nodes, submits work) and the node key.

Keys come from eth-account keystore files (scrypt / pbkdf2 encrypted JSON) whose password is read
from an environment variable or a file, never from the command line (it would show in `ps` and
in shell history). For local development chains a dev mode derives both keys from anvil's
public test mnemonic; such keys are worthless anywhere else, so dev mode refuses a chain id that
is not a local one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.worker.config import KeysConfig

__all__ = [
    "ANVIL_MNEMONIC",
    "LOCAL_CHAIN_IDS",
    "KeystoreError",
    "WorkerKeys",
    "dev_account",
    "load_keys",
    "write_keystore",
]

# anvil's (and hardhat's) public development mnemonic: every key it derives is public knowledge
ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
LOCAL_CHAIN_IDS = (31337, 1337)


class KeystoreError(ValueError):
    """A key that cannot be loaded: missing file, no password, wrong password, bad keystore."""


@dataclass(frozen=True)
class WorkerKeys:
    provider: LocalAccount
    node: LocalAccount


def dev_account(index: int) -> LocalAccount:
    """Account `index` of anvil's test mnemonic (m/44'/60'/0'/0/index)."""
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def _password(cfg: KeysConfig, env: dict[str, str]) -> str:
    if cfg.password_file:
        path = Path(cfg.password_file)
        if not path.is_file():
            raise KeystoreError(f"keys: password file {path} not found")
        return path.read_text().rstrip("\r\n")
    if cfg.password_env and cfg.password_env in env:
        return env[cfg.password_env]
    raise KeystoreError(f"keys: no password: set ${cfg.password_env} or keys.password_file")


def _decrypt(path_text: str, password: str, what: str) -> LocalAccount:
    path = Path(path_text)
    if not path_text or not path.is_file():
        raise KeystoreError(f"keys: {what} keystore {path_text or '(not set)'} not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KeystoreError(f"keys: {what} keystore {path} is not JSON ({e})") from None
    try:
        return Account.from_key(Account.decrypt(data, password))
    except ValueError as e:  # eth-account raises ValueError for a wrong password (MAC mismatch)
        raise KeystoreError(f"keys: cannot decrypt the {what} keystore {path}: {e}") from None
    except (KeyError, TypeError) as e:
        raise KeystoreError(f"keys: {what} keystore {path} is malformed ({e})") from None


def load_keys(cfg: KeysConfig, chain_id: int, env: dict[str, str] | None = None) -> WorkerKeys:
    """The provider and node keys named by `cfg` (env: the process environment by default)."""
    if cfg.dev_index is not None:
        if chain_id not in LOCAL_CHAIN_IDS:
            raise KeystoreError(f"keys: dev keys are for local chains {LOCAL_CHAIN_IDS}, "
                            f"not chain {chain_id}")
        return WorkerKeys(dev_account(2 * cfg.dev_index + 1), dev_account(2 * cfg.dev_index + 2))
    password = _password(cfg, dict(os.environ) if env is None else env)
    provider = _decrypt(cfg.provider_keystore, password, "provider")
    node = _decrypt(cfg.node_keystore, password, "node")
    if provider.address == node.address:
        raise KeystoreError("keys: the provider and node keys must differ")
    return WorkerKeys(provider, node)


def write_keystore(account: LocalAccount, password: str, path: str | Path,
                   iterations: int | None = None) -> Path:
    """Encrypt `account` to a keystore file readable only by its owner (for setup and tests)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kdf = {} if iterations is None else {"kdf": "pbkdf2", "iterations": iterations}
    data = Account.encrypt(account.key, password, **kdf)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return path
