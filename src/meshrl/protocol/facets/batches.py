"""The batches facet (issue 46; `contracts/batches.vy`, run by the protocol's fallback, so
called at the protocol's address; `meshrl.protocol.batches` builds the trees): a batch is a work
item keyed by its batch id, so the work facet's `claim`, `hard_invalidate`, `standing` and
`work` take it too."""

from __future__ import annotations

from meshrl.protocol.batches import Batch, Leaf, batch_id
from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import Receipt

__all__ = ["BatchesFacet"]


class BatchesFacet(Facet):
    """Batches of work committed by a Merkle root (`batches.vy`)."""

    @staticmethod
    def batch_id(node: str, root: bytes) -> bytes:
        return batch_id(node, root)

    def submit_batch(
        self, pool: int, node: str, root: bytes, count: int, units: int, gas: int | None = None
    ) -> Receipt:
        """Commit `count` files of `node` by their Merkle root and total units; the
        `BatchSubmitted` event carries its `batch_id`."""
        return self._send(
            self.contract.functions.submit_batch(pool, node, root, count, units), gas
        )

    def submit_leaves(self, pool: int, leaves: list[Leaf]) -> tuple[Batch, Receipt]:
        """Build the batch of `leaves` (one node's files) and submit it."""
        batch = Batch.of(leaves)
        return batch, self.submit_batch(pool, batch.node, batch.root, batch.count, batch.units)

    def open_leaf(
        self,
        root: bytes,
        index: int,
        leaf: Leaf,
        proof: list[bytes],
        verdict: int = 0,
        gas: int | None = None,
    ) -> Receipt:
        """Take leaf `index` out of the batch of (`leaf.node`, `root`) with its proof (a
        validator, within the batch's window): it becomes the work item `leaf.work_id`, and
        `verdict` (`WorkStatus.SOFT_INVALIDATED` / `HARD_INVALIDATED`, 0 none) accuses it in
        the same transaction. A file that already has an item is void in the batch instead,
        and the verdict accuses the batch (`LeafOpened.copy`)."""
        fn = self.contract.functions.open_leaf(
            leaf.node, root, index, leaf.file_sha256, leaf.units, leaf.step, leaf.counter,
            list(proof), verdict,
        )
        return self._send(fn, gas)

    def accuse_leaf(self, batch: Batch, index: int, hard: bool) -> Receipt:
        """A verdict on one file of `batch`: open it with its proof and accuse it."""
        return self.open_leaf(batch.root, index, batch.leaves[index], batch.proof(index),
                              3 if hard else 2)

    def claim_batch(self, batch_ids: list[bytes], gas: int | None = None) -> Receipt:
        """Claim batches (and any items) at once: one item per batch, whatever its size."""
        return self.claim(batch_ids, gas)
