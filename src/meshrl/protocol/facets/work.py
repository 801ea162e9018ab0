"""The work facet (`contracts/work.vy`): work items and rewards, keyed by work id =
keccak256(abi_encode(node, file sha256)); validators' verdicts, their disputes (challenge, vote,
settle), and claims."""

from __future__ import annotations

from meshrl.protocol.errors import TxReverted
from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import DisputeInfo, Receipt, WorkInfo
from meshrl.protocol.signing import work_id

__all__ = ["SETTLE_GAS", "WorkFacet"]

# settle: an upheld hard verdict's slash, wipe and review, and each voter's stake (at most 8)
# (benchmarks/README.md)
SETTLE_GAS = 500_000


class WorkFacet(Facet):
    """Work items, verdicts, disputes and claims (`work.vy`)."""

    @staticmethod
    def work_id(node: str, file_sha256: bytes) -> bytes:
        return work_id(node, file_sha256)

    def submit_work(self, pool: int, node: str, file_sha256: bytes, units: int) -> Receipt:
        """Submit a file's work; the `WorkSubmitted` event carries its `work_id`."""
        return self._send(self.contract.functions.submit_work(pool, node, file_sha256, units))

    # verdicts and their disputes
    def hard_invalidate(self, work_id: bytes) -> Receipt:
        """Accuse work of fraud (final at once when the dispute period is 0, else after it:
        `settle`)."""
        return self._send(self.contract.functions.hard_invalidate(work_id))

    def soft_invalidate(self, work_id: bytes) -> Receipt:
        return self._send(self.contract.functions.soft_invalidate(work_id))

    def challenge(self, work_id: bytes) -> Receipt:
        """The accused provider disputes the verdict on its work, once, paying a deposit of
        `DisputeInfo.stake` from its stake (refunded if the verdict is overturned)."""
        return self._send(self.contract.functions.challenge(work_id))

    def vote(self, work_id: bytes, uphold: bool) -> Receipt:
        """Another validator re-judges a verdict (an overturn vote also challenges it); the
        vote locks `DisputeInfo.stake` of its bond, lost if it is on the losing side."""
        return self._send(self.contract.functions.vote(work_id, uphold))

    def rule(self, work_id: bytes, uphold: bool) -> Receipt:
        """The federator decides a challenged verdict (its vote is a ruling)."""
        return self._send(self.contract.functions.vote(work_id, uphold))

    def voters(self, work_id: bytes) -> list[str]:
        """The validators who voted on the verdict on `work_id`, in order."""
        f, out = self.contract.functions, []
        for i in range(8):  # work.vy's MAX_VOTERS
            try:
                out.append(self._view(f.voters(work_id, i)))
            except TxReverted:  # past the end: the getter reverts
                break
        return out

    def review_until(self, provider: str | None = None) -> int:
        """Until when `provider`'s unclaimed work may be re-judged and its claims wait (set
        by an upheld hard verdict against it)."""
        return self._view(self.contract.functions.review_until(provider or self.address))

    def settle(self, work_id: bytes, gas: int | None = None) -> Receipt:
        """Make a verdict final once its dispute period is over (anyone). `gas` skips the
        estimate, which a node runs at its latest block: on a chain that mines only with
        transactions (anvil) that block can be older than the period's end while the next one
        is not (`SETTLE_GAS` covers an upheld hard verdict's slash and wipe)."""
        return self._send(self.contract.functions.settle(work_id), gas)

    def dispute(self, work_id: bytes) -> DisputeInfo:
        return DisputeInfo(*self._view(self.contract.functions.disputes(work_id)))

    def standing(self, work_id: bytes) -> int:
        """`Standing.CLEAR`, `WIPED` (an upheld verdict on its node reached it) or `DISPUTED`."""
        return self._view(self.contract.functions.standing(work_id))

    def set_dispute_params(
        self, verdict_bond: int, dispute_period: int, vote_period: int, quorum: int
    ) -> Receipt:
        fn = self.contract.functions.set_dispute_params(
            verdict_bond, dispute_period, vote_period, quorum
        )
        return self._send(fn)

    # claims and views
    def claim(self, work_ids: list[bytes], gas: int | None = None) -> Receipt:
        return self._send(self.contract.functions.claim(list(work_ids)), gas)

    def set_work_params(self, invalidation_window: int, lock_period: int, penalty: int) -> Receipt:
        fn = self.contract.functions.set_work_params(invalidation_window, lock_period, penalty)
        return self._send(fn)

    def work(self, work_id: bytes) -> WorkInfo:
        return WorkInfo(*self._view(self.contract.functions.work_info(work_id)))

    def works(self, work_ids: list[bytes]) -> list[WorkInfo]:
        """`work` of each, in batched reads (`Backend.call_many`)."""
        f = self.contract.functions
        return [WorkInfo(*r) for r in self.backend.call_many([f.work_info(w) for w in work_ids])]

    def claimable(self, work_id: bytes) -> bool:
        return self._view(self.contract.functions.claimable(work_id))

    def last_submission(self, node: str) -> int:
        """When `node` last submitted in a pool with a submission interval (0: never)."""
        return self._view(self.contract.functions.last_submission(node))
