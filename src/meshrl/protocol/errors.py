"""The one exception type a failed chain action raises, whatever the backend."""

from __future__ import annotations

__all__ = ["ChainError", "TxReverted"]


class ChainError(RuntimeError):
    """A chain action that could not be carried out (node unreachable, bad config, ...)."""


class TxReverted(ChainError):
    """A transaction or call reverted; `reason` is the contract's revert message ("" if none)."""

    def __init__(self, reason: str, tx_hash: str | None = None):
        self.reason = reason
        self.tx_hash = tx_hash
        where = f" (tx {tx_hash})" if tx_hash else ""
        super().__init__(f"reverted: {reason or '<no reason>'}{where}")
