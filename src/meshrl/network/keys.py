"""The accounts of a local network, all derived from anvil's public test mnemonic (a dev network
only: these keys are public knowledge).

Workers follow `meshrl worker --keys.dev_index i` (provider = account 2i+1, node = 2i+2);
account 0 is the federator; the first validator, the pool manager and the trainer come after the
workers' accounts, and the other validators after the trainer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

__all__ = ["DevKeys", "dev_account", "hexkey", "write_key_file"]

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"


def dev_account(index: int) -> LocalAccount:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def hexkey(a: LocalAccount) -> str:
    return "0x" + bytes(a.key).hex()


def write_key_file(a: LocalAccount, path: Path) -> Path:
    """The key as one hex line in a file only its owner reads (what `chain.key_file` and the
    trainer's `network.key_file` read): keys never go on a command line or in a config file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(hexkey(a) + "\n")
    return path


@dataclass(frozen=True)
class DevKeys:
    workers: int

    @property
    def validator_index(self) -> int:
        return 2 * self.workers + 1

    def federator(self) -> LocalAccount:
        return dev_account(0)

    def provider(self, i: int) -> LocalAccount:
        return dev_account(2 * i + 1)

    def node(self, i: int) -> LocalAccount:
        return dev_account(2 * i + 2)

    def validator(self, j: int = 0) -> LocalAccount:
        return dev_account(self.validator_dev_index(j))

    def validator_dev_index(self, j: int) -> int:
        """Validator j's account: 2w+1 for the first (as before there were several), then
        after the trainer's."""
        return self.validator_index if j == 0 else 2 * self.workers + 3 + j

    def manager(self) -> LocalAccount:
        return dev_account(2 * self.workers + 2)

    def trainer(self) -> LocalAccount:
        return dev_account(2 * self.workers + 3)
