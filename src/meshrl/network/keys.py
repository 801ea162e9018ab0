"""The accounts of a local network, all derived from anvil's public test mnemonic (a dev network
only: these keys are public knowledge).

Workers follow `meshrl worker --keys.dev_index i` (provider = account 2i+1, node = 2i+2);
account 0 is the federator; the validator, the pool manager and the trainer come after the
workers' accounts.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount

__all__ = ["DevKeys", "dev_account"]

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"


def dev_account(index: int) -> LocalAccount:
    Account.enable_unaudited_hdwallet_features()
    return Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")


def hexkey(a: LocalAccount) -> str:
    return "0x" + bytes(a.key).hex()


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

    def validator(self) -> LocalAccount:
        return dev_account(self.validator_index)

    def manager(self) -> LocalAccount:
        return dev_account(2 * self.workers + 2)

    def trainer(self) -> LocalAccount:
        return dev_account(2 * self.workers + 3)
