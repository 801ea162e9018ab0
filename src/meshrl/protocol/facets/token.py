"""The token facet: balances, transfers and allowances of the stake/reward ERC-20
(`contracts/token.vy`, its own contract at `Deployment.token`), and gas money."""

from __future__ import annotations

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import Receipt

__all__ = ["TokenFacet"]


class TokenFacet(Facet):
    """The stake/reward ERC-20 (`contracts/token.vy`), and the chain's native currency."""

    def balance(self, who: str | None = None) -> int:
        return self._view(self.token.functions.balanceOf(who or self.address))

    def send_ether(self, to: str, wei: int) -> str:
        """Send `wei` of the chain's native currency (gas money) to `to`; the tx hash."""
        r = self.backend.send(self._signer(), {"to": to, "value": wei, "gas": 21_000})
        return "0x" + bytes(r["transactionHash"]).hex()

    def transfer(self, to: str, amount: int, gas: int | None = None) -> Receipt:
        return self._send(self.token.functions.transfer(to, amount), gas)

    def approve(self, spender: str, amount: int) -> Receipt:
        """Set an allowance outright. Racy when changing one non-zero value to another (a
        spender that front-runs the change spends both): change a live allowance with
        `increase_allowance` / `decrease_allowance`, as this client does itself."""
        return self._send(self.token.functions.approve(spender, amount))

    def increase_allowance(self, spender: str, added: int) -> Receipt:
        return self._send(self.token.functions.increaseAllowance(spender, added))

    def decrease_allowance(self, spender: str, subtracted: int) -> Receipt:
        """Lower an allowance; reverts if the spender already used more than would be left."""
        return self._send(self.token.functions.decreaseAllowance(spender, subtracted))

    def allowance(self, owner: str, spender: str) -> int:
        return self._view(self.token.functions.allowance(owner, spender))
