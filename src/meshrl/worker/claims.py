"""The worker claims its own rewards, so one process owns the provider key's nonce.

A claim sent by another process (`meshrl chain claim`) while the worker submits work races it
for the provider key's next nonce; inside the worker every transaction of a key goes through
the backend's per-sender lock (`Backend.send`), so the claimer and the courier never pick the
same nonce. Every `claim_every_s` the claimer reads this provider's claimable items in the pool
(`provider_rewards`: its own logs, two JSON-RPC batches) and claims them in batches of at most
`claim_batch` (the contract's limit is 64; fewer where the RPC's bounds take fewer, and
halved on a refusal for size: meshrl.protocol.claiming). A transport failure is waited out like
every other phase (`retrying`); a refused claim (e.g. the stake no longer covers the provider's
nodes, or an RPC that takes not even one item) is logged and tried again next round, never
fatal: the rewards stay on chain.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from meshrl.log import get_logger, log_event
from meshrl.protocol import Protocol, TxReverted
from meshrl.protocol.claiming import ClaimTooLarge, claim_all
from meshrl.protocol.history import provider_rewards
from meshrl.wire.detached import detached
from meshrl.worker.retry import retrying

__all__ = ["ClaimRound", "Claimer"]

log = get_logger("meshrl.worker")


@dataclass
class ClaimRound:
    """One round: items claimed, tokens minted (base units), the transactions."""

    items: int = 0
    amount: int = 0
    txs: list[str] = field(default_factory=list)


class Claimer:
    """Claims the claimable rewards of `chain`'s signer (the provider) in `pool`."""

    def __init__(self, chain: Protocol, pool: int, every_s: float, batch: int = 64) -> None:
        if not 1 <= batch <= 64:
            raise ValueError("claim batch: 1 to 64 items (the contract's limit)")
        self.chain, self.pool, self.every_s, self.batch = chain, pool, every_s, batch
        self.claimed = 0  # token base units claimed by this process
        self.items = 0
        self.refused = 0  # rounds refused by the chain (logged, retried next round)

    def claim_once(self) -> ClaimRound:
        """Claim every item claimable now, `batch` per transaction (blocking)."""
        view = provider_rewards(self.chain, self.pool, self.chain.address)
        ids = [bytes.fromhex(w["work_id"]) for w in view["works"] if w["claimable"]]
        if not ids:
            return ClaimRound()
        # batches sized to the RPC's bounds, halved on a refusal for size; the size that
        # fitted is kept for the next rounds
        done = claim_all(self.chain, ids, self.batch)
        self.batch = done.batch
        self.items += done.items
        self.claimed += done.amount
        return ClaimRound(done.items, done.amount, done.txs)

    async def run(self, stop: asyncio.Event) -> None:
        """A round every `every_s` until `stop`; the first one after `every_s`."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
            if stop.is_set():
                return
            try:
                got = await retrying("claiming", lambda: detached(self.claim_once),
                                     stop)
            except (TxReverted, ClaimTooLarge) as e:  # a refusal, not the network's doing
                self.refused += 1
                log_event(log, "claim refused", reason=str(e))
                continue
            except Exception:
                if stop.is_set():  # stopped while a transport failure was waited out
                    return
                raise
            if got.items:
                log_event(log, "claimed", items=got.items, amount=got.amount, txs=got.txs,
                          total=self.claimed)
