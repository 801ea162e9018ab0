"""The stake facet (`contracts/stake.vy`): providers' stake (register, add, unbond, withdraw),
validators' bonds, slashing, and the protocol's totals. Paying in approves the protocol through
the token facet's `increase_allowance` first."""

from __future__ import annotations

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import ProviderInfo, Receipt

__all__ = ["StakeFacet"]


class StakeFacet(Facet):
    """Providers' stake and validators' bonds (`stake.vy`)."""

    def register_provider(self, amount: int, approve: bool = True) -> Receipt:
        """Register with `amount` of stake; `approve` raises the protocol's allowance by it
        first (`increaseAllowance`: an allowance still in use is never overwritten)."""
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.register_provider(amount))

    def add_stake(self, amount: int, approve: bool = True) -> Receipt:
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.add_stake(amount))

    def request_unstake(self, amount: int) -> Receipt:
        return self._send(self.contract.functions.request_unstake(amount))

    def withdraw(self, gas: int | None = None) -> Receipt:
        return self._send(self.contract.functions.withdraw(), gas)

    # validator bonds
    def post_bond(self, amount: int, approve: bool = True) -> Receipt:
        """Add to this validator's bond (a verdict locks `verdict_bond` of it until settled)."""
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.post_bond(amount))

    def withdraw_bond(self, amount: int) -> Receipt:
        return self._send(self.contract.functions.withdraw_bond(amount))

    def bond(self, who: str | None = None) -> tuple[int, int]:
        """(bond, locked by open verdicts) of a validator."""
        f, who = self.contract.functions, who or self.address
        return self._view(f.bonds(who)), self._view(f.bond_locked(who))

    def slash(self, provider: str, amount: int) -> Receipt:
        return self._send(self.contract.functions.slash(provider, amount))

    def collect_slashed(self, receiver: str) -> Receipt:
        return self._send(self.contract.functions.collect_slashed(receiver))

    def set_stake_params(
        self, min_stake: int, stake_per_unit: int, unbonding_delay: int
    ) -> Receipt:
        fn = self.contract.functions.set_stake_params(min_stake, stake_per_unit, unbonding_delay)
        return self._send(fn)

    # views
    def provider(self, who: str | None = None) -> ProviderInfo:
        return ProviderInfo(*self._view(self.contract.functions.providers(who or self.address)))

    def required_stake(self, who: str | None = None) -> int:
        return self._view(self.contract.functions.required_stake(who or self.address))

    def open_verdicts(self, provider: str | None = None) -> int:
        """Hard verdicts against `provider`'s work still disputable (neither settled nor
        overturned yet)."""
        return self._view(self.contract.functions.open_verdicts(provider or self.address))

    def totals(self) -> dict[str, int]:
        f = self.contract.functions
        return {
            "stake": self._view(f.total_stake()),
            "unbonding": self._view(f.total_unbonding()),
            "slashed": self._view(f.total_slashed()),
            "claimed": self._view(f.total_claimed()),
            "bonds": self._view(f.total_bonds()),
            "deposits": self._view(f.total_deposits()),
        }
