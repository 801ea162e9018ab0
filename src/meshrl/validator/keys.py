"""The validator's signing key: an eth-account keystore (password from an environment variable
or a file, never the command line), or, on local chains only, an account of anvil's public
test mnemonic."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.validator.config import ValidatorKeysConfig

__all__ = ["ValidatorKeyError", "load_validator_key"]

_MNEMONIC = "test test test test test test test test test test test junk"
_LOCAL_CHAINS = (31337, 1337)


class ValidatorKeyError(ValueError):
    """No usable key: missing file or password, wrong password, or dev keys on a real chain."""


def load_validator_key(cfg: ValidatorKeysConfig, chain_id: int,
                       env: dict[str, str] | None = None) -> LocalAccount:
    if cfg.dev_index is not None:
        if chain_id not in _LOCAL_CHAINS:
            raise ValidatorKeyError(f"dev keys are for local chains, not chain {chain_id}")
        Account.enable_unaudited_hdwallet_features()
        return Account.from_mnemonic(_MNEMONIC, account_path=f"m/44'/60'/0'/0/{cfg.dev_index}")
    env = dict(os.environ) if env is None else env
    if cfg.password_file:
        password = Path(cfg.password_file).read_text().rstrip("\r\n")
    elif cfg.password_env in env:
        password = env[cfg.password_env]
    else:
        raise ValidatorKeyError(f"no password: set ${cfg.password_env} or keys.password_file")
    try:
        return Account.from_key(Account.decrypt(json.loads(Path(cfg.keystore).read_text()),
                                                password))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValidatorKeyError(f"cannot load keystore {cfg.keystore}: {e}") from None
