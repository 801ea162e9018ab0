"""What a validator does on chain with its own judgment of a file, now that verdicts can be
disputed (docs/protocol.md, *Verdicts and disputes*): accuse work it finds invalid; re-judge
another validator's open verdict by voting (uphold when it also finds the file invalid,
overturn when it accepts it); settle the verdicts it made or voted on once their dispute
period is over; keep a bond posted that covers its open verdicts.

Torch-free; `Clerk` is the chain side (blocking calls, run in a thread by the node), and
`next_action` the rule, a pure function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from meshrl.log import get_logger, log_event
from meshrl.protocol import (
    SETTLE_GAS,
    DisputeOpen,
    NotAccused,
    Protocol,
    TxReverted,
    WorkStatus,
)
from meshrl.protocol.batches import Leaf
from meshrl.wire.models import VerdictKind

__all__ = ["Action", "Clerk", "LeafRef", "next_action"]

log = get_logger("meshrl.validator")


class Action(StrEnum):
    NONE = "none"
    ACCUSE_HARD = "accuse_hard"
    ACCUSE_SOFT = "accuse_soft"
    UPHOLD = "uphold"
    OVERTURN = "overturn"


def next_action(status: int, accused_by_me: bool, kind: VerdictKind) -> Action:
    """The on-chain step for this validator's own verdict `kind` on work in `status`."""
    invalid = kind is not VerdictKind.ACCEPT
    if status == WorkStatus.SUBMITTED:
        if kind is VerdictKind.HARD_INVALID:
            return Action.ACCUSE_HARD
        return Action.ACCUSE_SOFT if invalid else Action.NONE
    if status == WorkStatus.ACCUSED and not accused_by_me:
        return Action.UPHOLD if invalid else Action.OVERTURN
    return Action.NONE  # final already, or this validator's own open verdict


@dataclass(frozen=True)
class LeafRef:
    """A file still inside its batch: what `open_leaf` needs to take it out and accuse it."""

    root: bytes
    index: int
    leaf: Leaf
    proof: list[bytes]


class Clerk:
    """The validator's disputes on chain. `to_settle` (work id -> when its dispute period ends
    as last read) lives in memory: after a restart, verdicts left open are settled by whoever
    calls `settle` first (the provider, another validator)."""

    def __init__(self, chain: Protocol) -> None:
        self.chain = chain
        self.me = chain.address.lower()
        self.to_settle: dict[bytes, int] = {}

    def ensure_bond(self, verdicts: int) -> int:
        """Post what is missing for `verdicts` open verdicts (none when verdicts need no bond);
        returns the amount posted."""
        per = int(self.chain.backend.call(self.chain.contract.functions.verdict_bond()))
        bond, _ = self.chain.bond()
        missing = per * verdicts - bond
        if per == 0 or missing <= 0:
            return 0
        self.chain.post_bond(missing)
        log_event(log, "bond posted", amount=missing, bond=bond + missing)
        return missing

    def act(self, work_id: bytes, kind: VerdictKind, leaf: LeafRef | None = None,
            copy: bool = False) -> str:
        """Accuse or vote as `kind` says; the transaction hash, or "" when nothing was sent.
        `leaf`: the file is a leaf of a batch; not opened yet (no item under its work id), an
        accusation opens it with its proof and accuses it in one transaction (`open_leaf`).
        `copy`: the leaf's file has an item of its own already: opening it voids the leaf and
        the verdict accuses its batch."""
        info = self.chain.work(work_id)
        inside = leaf is not None and (copy or info.status == WorkStatus.NONE)
        status = info.status
        if inside:
            status = WorkStatus.SUBMITTED  # pending inside its batch
        mine = False
        if status == WorkStatus.ACCUSED:
            mine = self.chain.dispute(work_id).validator.lower() == self.me
        action = next_action(status, mine, kind)
        try:
            if action in (Action.ACCUSE_HARD, Action.ACCUSE_SOFT) and inside:
                assert leaf is not None
                r = self.chain.open_leaf(leaf.root, leaf.index, leaf.leaf, leaf.proof,
                                         3 if action is Action.ACCUSE_HARD else 2)
                until = int(r.event("WorkAccused").args["until"])
                work_id = bytes(r.event("WorkAccused").args["work_id"])  # a copy's: the batch
            elif action in (Action.ACCUSE_HARD, Action.ACCUSE_SOFT):
                fn = (self.chain.hard_invalidate if action is Action.ACCUSE_HARD
                      else self.chain.soft_invalidate)
                r = fn(work_id)
                until = int(r.event("WorkAccused").args["until"])
            elif action in (Action.UPHOLD, Action.OVERTURN):
                r = self.chain.vote(work_id, action is Action.UPHOLD)
                until = self.chain.dispute(work_id).until
            else:
                return ""
        except TxReverted as e:
            log_event(log, "verdict refused", work_id=work_id.hex(), action=action.value,
                      error=str(e))
            return ""
        if until:  # 0: settled in the same transaction (no dispute period)
            self.to_settle[work_id] = until
        log_event(log, "verdict on chain", work_id=work_id.hex(), action=action.value,
                  tx=r.tx_hash)
        return r.tx_hash

    def settle_due(self) -> int:
        """Settle every followed verdict whose dispute period is over; returns how many.
        Following none, it reads nothing: it runs every loop of the validator (four a second
        when idle), and a read of the chain's time each was a validator's third-largest cost."""
        if not self.to_settle:
            return 0
        # the next block is no older than the latest one, nor than the clock: an idle chain
        # (no blocks for a while, as at the end of a run) still settles on time
        now, done = max(self.chain.backend.now(), int(time.time())), 0
        for wid, until in sorted(self.to_settle.items(), key=lambda kv: kv[1]):
            if until > now:
                continue
            try:
                r = self.chain.settle(wid, SETTLE_GAS)
                done += 1
                log_event(log, "verdict settled", work_id=wid.hex(), tx=r.tx_hash,
                          overturned=any(e.name == "VerdictOverturned" for e in r.events))
            except NotAccused:
                pass  # settled by someone else
            except DisputeOpen:  # a challenge lengthened it
                self.to_settle[wid] = self.chain.dispute(wid).until
                continue
            except TxReverted as e:
                log_event(log, "settle refused", work_id=wid.hex(), error=str(e))
            del self.to_settle[wid]
        return done
