"""The exception types a failed chain action raises, whatever the backend.

A revert is a `TxReverted`; the reverts callers act on arrive as a subclass, chosen by the
contract's exact revert message in `REVERTS` (the one table from reason to class), so a caller
catches `DuplicateFile` instead of reading the message.
"""

from __future__ import annotations

__all__ = [
    "REVERTS", "AlreadyChallenged", "AlreadyVoted", "BadLeaf", "BadProof", "BondTooLow",
    "ChainError", "DisputeOpen",
    "DisputePeriodOver",
    "DuplicateFile", "InvalidationWindowClosed", "InviteExpired", "InviteUsed",
    "NodeBlacklisted", "NodeNotInPool", "NotAccused", "NotBonded", "OutOfGas", "RequestTooLarge",
    "TxReverted",
    "UnderReview", "VerdictOverturned", "VerdictPending", "WorkDisputed", "WorkNotPending",
    "WorkStillJudgeable", "reverted",
]


class ChainError(RuntimeError):
    """A chain action that could not be carried out (node unreachable, bad config, ...)."""


class RequestTooLarge(ChainError):
    """The endpoint refused the request for its size (HTTP 413 from an RPC filter's body
    bound): a smaller request may pass (`protocol/claiming.py` halves its batch)."""


# HTTP refusals of a JSON-RPC endpoint that have a meaning of their own, by status
HTTP_REFUSALS: dict[int, type[ChainError]] = {413: RequestTooLarge}


class TxReverted(ChainError):
    """A transaction or call reverted; `reason` is the contract's revert message ("" if none)."""

    def __init__(self, reason: str, tx_hash: str | None = None):
        self.reason = reason
        self.tx_hash = tx_hash
        where = f" (tx {tx_hash})" if tx_hash else ""
        super().__init__(f"reverted: {reason or '<no reason>'}{where}")


class DuplicateFile(TxReverted):
    """The node submitted this file before (work is keyed by node and file)."""


class NodeNotInPool(TxReverted):
    """The node is not (or no longer) in the pool it acts for: never joined, left or ejected."""


class NodeBlacklisted(TxReverted):
    """The pool blacklisted the node: it cannot join it again."""


class InviteExpired(TxReverted):
    """The invite's expiry has passed."""


class InviteUsed(TxReverted):
    """The invite was used already."""


class WorkNotPending(TxReverted):
    """The work is no longer awaiting a verdict (invalidated or claimed already)."""


class InvalidationWindowClosed(TxReverted):
    """The work's invalidation window has closed: it can no longer be invalidated."""


class WorkDisputed(TxReverted):
    """The item, or a verdict that reaches it, is still open: its reward waits for settlement."""


class NotAccused(TxReverted):
    """No open verdict on this work (never accused, or settled already)."""


class DisputeOpen(TxReverted):
    """The verdict's dispute period is not over: it cannot be settled yet."""


class DisputePeriodOver(TxReverted):
    """The verdict's dispute period is over: no more challenges or votes, only settlement."""


class AlreadyVoted(TxReverted):
    """This validator voted on the verdict before."""


class BondTooLow(TxReverted):
    """The validator's free bond does not cover another open verdict (`verdict_bond`)."""


class NotBonded(TxReverted):
    """A validator without the bond a verdict puts at stake may not vote (kept for callers:
    a vote now locks a stake, so its refusal is `BondTooLow`)."""


class AlreadyChallenged(TxReverted):
    """A verdict is challenged once: a second challenge neither reopens nor extends it."""


class UnderReview(TxReverted):
    """The provider is under an open hard verdict, or under review after an upheld one:
    nothing of its is claimed until then."""


class VerdictOverturned(TxReverted):
    """The work was accused before and the verdict overturned: it is not judged again."""


class VerdictPending(TxReverted):
    """A verdict against the provider's work is open: its stake stays until it is settled."""


class WorkStillJudgeable(TxReverted):
    """An invalidation window of the provider's work is open: unbonded stake waits for it."""


class BadProof(TxReverted):
    """A leaf's Merkle proof does not lead to the batch's root (or has the wrong length)."""


class BadLeaf(TxReverted):
    """A leaf index past the batch's count, or a leaf already opened."""


class OutOfGas(TxReverted):
    """The transaction ran out of gas (the backends report it as the reason "out of gas")."""


# the contracts' exact revert messages (protocol/contracts/*.vy) -> the class raised for them;
# every other reason is a plain `TxReverted`
REVERTS: dict[str, type[TxReverted]] = {
    "work: duplicate file": DuplicateFile,
    "work: node not in pool": NodeNotInPool,
    "pools: node not in pool": NodeNotInPool,
    "pools: node not in a pool": NodeNotInPool,
    "pools: node blacklisted": NodeBlacklisted,
    "pools: invite expired": InviteExpired,
    "pools: invite used": InviteUsed,
    "work: not pending": WorkNotPending,
    "work: invalidation window closed": InvalidationWindowClosed,
    "work: disputed": WorkDisputed,
    "work: not accused": NotAccused,
    "work: dispute open": DisputeOpen,
    "work: dispute period over": DisputePeriodOver,
    "work: already voted": AlreadyVoted,
    "work: already challenged": AlreadyChallenged,
    "work: under review": UnderReview,
    "work: verdict overturned": VerdictOverturned,
    "stake: bond too low": BondTooLow,
    "stake: verdict pending": VerdictPending,
    "stake: work still judgeable": WorkStillJudgeable,
    "work: bad proof": BadProof,
    "work: bad leaf": BadLeaf,
    "out of gas": OutOfGas,
}


def reverted(reason: str, tx_hash: str | None = None) -> TxReverted:
    """The exception of a revert with `reason`: its class in `REVERTS`, else `TxReverted`."""
    return REVERTS.get(reason, TxReverted)(reason, tx_hash)
