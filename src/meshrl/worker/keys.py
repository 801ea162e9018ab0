"""The worker's two keys: the provider key (stakes, adds nodes, submits work) and the node key.

Keys come from eth-account keystore files (scrypt / pbkdf2 encrypted JSON, `meshrl keys new`
writes them; `meshrl.protocol.keystore`) whose password is read from an environment variable or
a file, never from the command line (it would show in `ps` and
in shell history). For local development chains a dev mode derives both keys from anvil's
public test mnemonic; such keys are worthless anywhere else, so dev mode refuses a chain id that
is not a local one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.protocol.keystore import KeystoreError, decrypt_keystore, read_password, write_keystore
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


@dataclass(frozen=True)
class WorkerKeys:
    provider: LocalAccount
    node: LocalAccount


def dev_account(index: int) -> LocalAccount:
    """Account `index` of anvil's test mnemonic (m/44'/60'/0'/0/index)."""
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def load_keys(cfg: KeysConfig, chain_id: int, env: dict[str, str] | None = None) -> WorkerKeys:
    """The provider and node keys named by `cfg` (env: the process environment by default)."""
    if cfg.dev_index is not None:
        if chain_id not in LOCAL_CHAIN_IDS:
            raise KeystoreError(f"keys: dev keys are for local chains {LOCAL_CHAIN_IDS}, "
                            f"not chain {chain_id}")
        return WorkerKeys(dev_account(2 * cfg.dev_index + 1), dev_account(2 * cfg.dev_index + 2))
    password = read_password(cfg.password_file, cfg.password_env,
                             dict(os.environ) if env is None else env)
    provider = decrypt_keystore(cfg.provider_keystore, password, "provider")
    node = decrypt_keystore(cfg.node_keystore, password, "node")
    if provider.address == node.address:
        raise KeystoreError("keys: the provider and node keys must differ")
    return WorkerKeys(provider, node)
