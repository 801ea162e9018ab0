"""The worker challenges verdicts on its own files, so an honest provider is never silent.

A verdict nobody confirms stays open 24 dispute periods and then stands (docs/protocol.md,
*The verdict game*): a rogue validator, with its co-validators passive and the provider not
watching, slashed honest work and was paid nothing back. A worker knows its files are honest
(it made them with the policy and sampler the pool asked for), so it challenges every hard
verdict on an item of its own node while the verdict is open: the deposit (half the verdict's
bond, from the provider's stake) comes back when the verdict is overturned, with the accuser's
bond. A challenged verdict stands only with `quorum` upholds from other validators, who
re-judge the file themselves; so a true verdict is upheld and costs the challenge its deposit,
which is why a cheater (the adversaries' workers) does not challenge.

The accusations are read as the chain's `WorkAccused` events of this node alone (a topic
filter: the node sends nothing else), from the blocks after the last read; each one is
challenged once, a refusal (the stake does not cover the deposit, the verdict already
challenged or closed) logged and not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Literal

from eth_utils import event_abi_to_log_topic

from meshrl.log import get_logger, log_event
from meshrl.protocol import Protocol, TxReverted
from meshrl.protocol.events import EventCursor
from meshrl.wire.detached import detached
from meshrl.worker.retry import retrying

__all__ = ["Challenge", "Defender"]

log = get_logger("meshrl.worker")

Which = Literal["hard", "all", "off"]


@dataclass
class Challenge:
    """One verdict on this node's work seen by the defender, and what became of it."""

    work_id: bytes
    hard: bool
    until: int
    tx: str = ""
    refused: str = ""


@dataclass
class Defender:
    """Challenges the verdicts (`which`: hard ones, all, or none) on `node`'s items, sent with
    `chain`'s signer (the node's provider)."""

    chain: Protocol
    node: str
    every_s: float
    which: Which = "hard"
    seen: dict[bytes, Challenge] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.node = self.node.lower()
        abi = next(x for x in self.chain.contract.abi
                   if x.get("type") == "event" and x["name"] == "WorkAccused")
        # WorkAccused(work_id, provider, node) are its indexed arguments: the node sends this
        # node's accusations alone (every event of a busy pool, every round, from each of its
        # members, crossed a home link for nothing)
        topics = ["0x" + event_abi_to_log_topic(abi).hex(), None, None,
                  "0x" + "00" * 12 + self.node.removeprefix("0x")]
        self.cursor = EventCursor(self.chain.backend, self.chain.decoder,
                                  [self.chain.contract.address], self.chain.deployment.block,
                                  topics=topics)

    def defend_once(self) -> list[Challenge]:
        """Challenge every new open verdict on this node's work (blocking); the new ones."""
        if self.which == "off":
            return []
        new = []
        for e in self.cursor.poll():
            if e.name != "WorkAccused" or str(e.args["node"]).lower() != self.node:
                continue
            wid = bytes(e.args["work_id"])
            if wid in self.seen or not (e.args["hard"] or self.which == "all"):
                continue
            c = Challenge(wid, bool(e.args["hard"]), int(e.args["until"]))
            self.seen[wid] = c
            new.append(c)
        for c in new:
            self._challenge(c)
        return new

    def _challenge(self, c: Challenge) -> None:
        d = self.chain.dispute(c.work_id)
        now = max(self.chain.backend.now(), int(time.time()))
        if d.challenged or d.until <= now:
            c.refused = "already challenged" if d.challenged else "verdict closed"
            return
        try:
            c.tx = self.chain.challenge(c.work_id).tx_hash
        except TxReverted as e:  # e.g. the stake no longer covers the deposit
            c.refused = str(e)

    async def run(self, stop: asyncio.Event) -> None:
        """A round every `every_s` until `stop`."""
        while not stop.is_set():
            try:
                got = await retrying("defending", lambda: detached(self.defend_once), stop)
            except Exception:
                if stop.is_set():  # stopped while a transport failure was waited out
                    return
                raise
            for c in got:
                if c.tx:
                    log_event(log, "verdict challenged", work_id=c.work_id.hex(), hard=c.hard,
                              tx=c.tx)
                else:
                    log_event(log, "verdict not challenged", work_id=c.work_id.hex(),
                              reason=c.refused)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
