"""What every facet stands on: the state a `Protocol` holds (backend, deployment, signing
account, the token and protocol contracts, the event decoder), and the plumbing that signs a
transaction (`_send`), reads a view (`_view`) and follows events (`events`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshrl.protocol.events import EventCursor, EventDecoder
from meshrl.protocol.records import Deployment, Receipt

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from meshrl.protocol.backend import Backend

__all__ = ["Facet"]


class Facet:
    """The state and plumbing the facets share; `Protocol.__init__` sets the state."""

    backend: Backend
    deployment: Deployment
    account: LocalAccount | None
    token: Any  # the token contract (web3)
    contract: Any  # the protocol contract with its extension's functions (web3)
    decoder: EventDecoder

    def _signer(self) -> LocalAccount:
        if self.account is None:
            raise ValueError("this client has no signing account")
        return self.account

    @property
    def address(self) -> str:
        return self._signer().address

    def _send(self, fn: Any, gas: int | None = None) -> Receipt:
        tx: dict[str, Any] = {"to": fn.address, "data": fn._encode_transaction_data()}
        if gas is not None:
            tx["gas"] = gas
        r = self.backend.send(self._signer(), tx)
        return Receipt(
            "0x" + bytes(r["transactionHash"]).hex(),
            int(r["blockNumber"]),
            int(r["gasUsed"]),
            self.decoder.decode_receipt(r),
        )

    def _view(self, fn: Any) -> Any:
        sender = self.account.address if self.account else self.deployment.federator
        return self.backend.call(fn, sender)

    def events(self, from_block: int | None = None) -> EventCursor:
        """A cursor over token + protocol events, from the deployment block by default."""
        start = self.deployment.block if from_block is None else from_block
        return EventCursor(
            self.backend, self.decoder, [self.token.address, self.contract.address], start
        )
