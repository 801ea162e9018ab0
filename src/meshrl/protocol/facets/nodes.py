"""The nodes facet (`contracts/nodes.vy`): a provider's nodes, each added with an ownership
proof signed by its key (`meshrl.protocol.signing`, the Python side of `sig.vy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import NodeInfo, Receipt
from meshrl.protocol.signing import sign_ownership

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

__all__ = ["NodesFacet"]


class NodesFacet(Facet):
    """A provider's nodes (`nodes.vy`)."""

    def add_node(
        self, node_key: LocalAccount, compute_units: int, signature: bytes | None = None
    ) -> Receipt:
        """Add a node, signing the ownership proof with its key unless `signature` is given."""
        if signature is None:
            signature = sign_ownership(
                node_key.key,
                self.contract.address,
                self.backend.chain_id,
                self.address,
                self.node_generation(node_key.address),
            )
        return self._send(
            self.contract.functions.add_node(node_key.address, compute_units, signature)
        )

    def remove_node(self, node: str) -> Receipt:
        return self._send(self.contract.functions.remove_node(node))

    def node(self, node: str) -> NodeInfo:
        return NodeInfo(*self._view(self.contract.functions.node_info(node)))

    def nodes(self, nodes: list[str]) -> list[NodeInfo]:
        """`node` of each, in batched reads (`Backend.call_many`)."""
        f = self.contract.functions
        return [NodeInfo(*r) for r in self.backend.call_many([f.node_info(n) for n in nodes])]

    def node_generation(self, node: str) -> int:
        """The generation ownership proofs and invites for `node` must name now."""
        return self._view(self.contract.functions.node_generation(node))
