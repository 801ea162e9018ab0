"""Moving outbox files through upload and on-chain submission, resumable at every phase.

`Courier` is what delivery needs from the outside world (the orchestrator's upload slots and
the chain); `deliver` is the phase machine, written so that running it again after a crash at
any point finishes the file without a second upload slot being wasted on a stored file and
without a second submission.

With the pool's batch rule (`batch.files` > 1), `deliver_all` uploads each file, then forms a
batch of the uploaded files that wait (oldest first) once `batch.files` of them wait or the
oldest has waited `batch.max_delay_s` (or on `flush`), and `deliver_batch` takes it through
its phases (outbox.py): membership on disk, leaves posted to the orchestrator, root submitted
on chain once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Protocol

from meshrl.pool import BatchRule
from meshrl.protocol.batches import Batch, Leaf
from meshrl.worker.outbox import BatchRecord, Outbox, OutboxEntry, is_stale

__all__ = ["BatchCourier", "Courier", "DuplicateSubmission", "RefusedFile", "RetryLater",
           "StaleFile", "deliver", "deliver_all", "deliver_batch"]

Outcome = Literal["sent", "dropped"]
Pause = Callable[[str, OutboxEntry], Awaitable[None]]


async def _no_pause(phase: str, entry: OutboxEntry) -> None:
    return None


class DuplicateSubmission(RuntimeError):
    """The chain already holds this file's submission (a retried transaction after a crash)."""


class RefusedFile(RuntimeError):
    """The orchestrator refuses the file for good (too old for the pool's step, its counter
    used by another file or out of range): it is dropped from the outbox."""


class StaleFile(RefusedFile):
    """The orchestrator refuses the file as too old for the pool's step."""


class RetryLater(RuntimeError):
    """A transient refusal (a slot granted before a crash has not expired yet, ...)."""


class Courier(Protocol):
    async def upload(self, entry: OutboxEntry, path: Path) -> None:
        """Store the file at the orchestrator; succeed if it is already stored."""

    async def submitted(self, entry: OutboxEntry) -> bool:
        """Whether the chain already holds this node's submission of the file."""

    async def submit(self, entry: OutboxEntry) -> str:
        """Submit on chain; the transaction hash. Raises DuplicateSubmission if already there."""


class BatchCourier(Courier, Protocol):
    """A courier of batches too (a pool whose rules batch its submissions)."""

    node: str

    async def post_batch(self, batch: Batch) -> None:
        """Give the orchestrator the batch's leaves; RefusedFile if it never takes them."""

    async def batch_submitted(self, batch_id: bytes) -> bool:
        """Whether the chain already holds this batch."""

    async def submit_batch(self, batch: Batch) -> str:
        """Submit the batch's root on chain; DuplicateSubmission if already there."""


async def deliver(outbox: Outbox, entry: OutboxEntry, courier: Courier, pool_step: int,
                  async_level: int, pause: Pause = _no_pause, upto: str = "") -> Outcome | None:
    """Finish one outbox entry from whatever phase a previous run left it in; with
    `upto="uploaded"` stop once it is uploaded (None: it waits for its batch)."""
    if entry.phase != "submitted":
        # sent before a crash, not yet recorded? (a file this process put and never sent
        # cannot be on chain: not asked)
        if entry.sha256 not in outbox.unsent and await courier.submitted(entry):
            outbox.mark(entry, "submitted")
        elif is_stale(entry.policy_version, pool_step, async_level):
            outbox.drop(entry, f"policy version {entry.policy_version} < step {pool_step} - "
                        f"async_level {async_level}")
            return "dropped"
    if entry.phase == "written":
        try:
            await courier.upload(entry, outbox.data_path(entry.sha256))
        except RefusedFile as e:
            outbox.drop(entry, f"orchestrator: {e}")
            return "dropped"
        outbox.mark(entry, "uploaded")
        await pause("uploaded", entry)
    if entry.phase == "uploaded" and upto == "uploaded":
        return None
    if entry.phase == "uploaded":
        outbox.sending(entry)
        try:
            tx = await courier.submit(entry)
        except DuplicateSubmission:
            tx = ""
        await pause("submitted-unrecorded", entry)  # on chain, not yet in the outbox record
        outbox.mark(entry, "submitted", tx)
    outbox.finish(entry)
    return "sent"


def _batch_of(outbox: Outbox, node: str, b: BatchRecord) -> tuple[Batch, list[OutboxEntry]]:
    entries = {e.sha256: e for e in outbox.pending()}
    mine = [entries[sha] for sha in b.files if sha in entries]
    if len(mine) != len(b.files):  # a crash inside finish_batch: the rest are sent already
        return Batch(tuple(), bytes.fromhex(b.root), tuple()), mine
    return Batch.of([Leaf(node, bytes.fromhex(e.sha256), e.work_units, e.policy_version,
                          e.counter)
                     for e in mine]), mine


async def deliver_batch(outbox: Outbox, b: BatchRecord, courier: BatchCourier, pool_step: int,
                        async_level: int, pause: Pause = _no_pause) -> tuple[Outcome, int]:
    """Finish one batch from whatever phase a previous run left it in; the outcome and how
    many files it held."""
    batch, entries = _batch_of(outbox, courier.node, b)
    if b.phase != "submitted":
        # sent before a crash, not yet recorded? (a batch this process formed and never sent
        # cannot be on chain: not asked)
        if b.batch_id not in outbox.unsent_batches and await courier.batch_submitted(
                bytes.fromhex(b.batch_id)):
            outbox.mark_batch(b, "submitted")
        elif all(is_stale(e.policy_version, pool_step, async_level) for e in entries):
            outbox.drop_batch(b, f"every file's policy version < step {pool_step} - "
                              f"async_level {async_level}")
            return "dropped", len(entries)
    if b.phase == "formed":
        try:
            await courier.post_batch(batch)
        except RefusedFile as e:
            outbox.drop_batch(b, f"orchestrator: {e}")
            return "dropped", len(entries)
        outbox.mark_batch(b, "posted")
        await pause("batch-posted", entries[0])
    if b.phase == "posted":
        outbox.sending_batch(b)
        try:
            tx = await courier.submit_batch(batch)
        except DuplicateSubmission:
            tx = ""
        await pause("batch-submitted-unrecorded", entries[0])
        outbox.mark_batch(b, "submitted", tx)
    outbox.finish_batch(b)
    return "sent", len(entries)


async def deliver_all(outbox: Outbox, courier: Courier, pool_step: int,
                      async_level: int, pause: Pause = _no_pause, batch: BatchRule | None = None,
                      now: float = 0.0, flush: bool = False) -> dict[str, int]:
    """Deliver every pending entry, oldest first; counts of each outcome (in files). With a
    `batch` rule of more than one file, uploaded files wait for their batch (module doc)."""
    counts = {"sent": 0, "dropped": 0}
    if batch is None or batch.files <= 1:
        for entry in outbox.pending():
            got = await deliver(outbox, entry, courier, pool_step, async_level, pause)
            counts[got or "sent"] += 1
        return counts
    bc: BatchCourier = courier  # type: ignore[assignment]
    for b in outbox.batches():  # what a previous run (or a failed delivery) left
        outcome, n = await deliver_batch(outbox, b, bc, pool_step, async_level, pause)
        counts[outcome] += n
    inside = outbox.batched()
    waiting = []
    for entry in outbox.pending():
        if entry.sha256 in inside:
            continue
        got = await deliver(outbox, entry, courier, pool_step, async_level, pause, "uploaded")
        if got is None:
            waiting.append(entry)
        else:
            counts[got] += 1
    while waiting:
        due = flush or now - waiting[0].created >= batch.max_delay_s
        if len(waiting) < batch.files and not due:
            break
        part, waiting = waiting[:batch.files], waiting[batch.files:]
        made = Batch.of([Leaf(bc.node, bytes.fromhex(e.sha256), e.work_units, e.policy_version,
                              e.counter)
                         for e in part])
        b = outbox.form_batch(made.id.hex(), made.root.hex(), [e.sha256 for e in part])
        await pause("batch-formed", part[0])
        outcome, n = await deliver_batch(outbox, b, bc, pool_step, async_level, pause)
        counts[outcome] += n
    return counts
