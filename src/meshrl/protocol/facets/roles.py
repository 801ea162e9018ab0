"""The roles facet (`contracts/roles.vy`): the federator, its proposed successor, and the
validators it appoints."""

from __future__ import annotations

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import Receipt

__all__ = ["RolesFacet"]


class RolesFacet(Facet):
    """The federator and the validators (`roles.vy`)."""

    def set_validator(self, validator: str, enabled: bool = True) -> Receipt:
        return self._send(self.contract.functions.set_validator(validator, enabled))

    def propose_federator(self, federator: str) -> Receipt:
        """First step of a hand-over (the zero address cancels); nothing moves yet."""
        return self._send(self.contract.functions.propose_federator(federator))

    def pending_federator(self) -> str:
        return self._view(self.contract.functions.pending_federator())

    def is_validator(self, who: str) -> bool:
        return self._view(self.contract.functions.validators(who))

    def federator(self) -> str:
        return self._view(self.contract.functions.federator())
