"""The treasury facet (`contracts/treasury.vy`): the token's powers, held by the protocol and
used by the federator (minting, appointing minters, recovering stray tokens), and accepting a
federator hand-over, which revokes the outgoing tenure's grants."""

from __future__ import annotations

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import Receipt

__all__ = ["TreasuryFacet"]


class TreasuryFacet(Facet):
    """The token's powers, held by the protocol and used by the federator (`treasury.vy`)."""

    def mint(self, to: str, amount: int) -> Receipt:
        return self._send(self.contract.functions.mint(to, amount))

    def set_minter(self, minter: str, enabled: bool) -> Receipt:
        return self._send(self.contract.functions.set_minter(minter, enabled))

    def recover_tokens(self, receiver: str) -> Receipt:
        """Send stake tokens transferred to the protocol by mistake (not staked) to `receiver`."""
        return self._send(self.contract.functions.recover_tokens(receiver))

    def granted_minters(self) -> list[str]:
        return list(self._view(self.contract.functions.granted_minters()))

    # the hand-over's second step (`propose_federator` is in roles.vy)
    def accept_federator(self, keep_grants: bool = False) -> Receipt:
        """Second step, by the proposed account: it takes every federator power. By default
        every role of the outgoing tenure is revoked (`handover_roles` lists them first:
        validators, pool managers, minters); `keep_grants` keeps them but still strips the
        outgoing key of its own validator and minting rights."""
        return self._send(self.contract.functions.accept_federator(keep_grants))

    def handover_roles(self) -> dict[str, list]:
        """The roles a hand-over now would revoke by default: validators and pool managers
        granted in the current federator's tenure, the minters appointed through the protocol,
        and which of them the federator key holds itself."""
        f = self.contract.functions
        fed = self.federator()
        named = {e.args["validator"] for e in self.events().poll() if e.name == "ValidatorSet"}
        validators = sorted(v for v in named if self.is_validator(v))
        managers = []
        for pool in range(1, self._view(f.pool_count()) + 1):
            manager = self._view(f.pool_manager(pool))
            if int(manager, 16):
                managers.append((pool, manager))
        minters = list(self._view(f.granted_minters()))
        held = sorted({a for a in [*validators, *minters, *(m for _, m in managers)] if a == fed})
        return {"validators": validators, "pool_managers": managers, "minters": minters,
                "held_by_federator": held}
