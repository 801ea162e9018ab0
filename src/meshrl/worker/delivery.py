"""Moving outbox files through upload and on-chain submission, resumable at every phase.

`Courier` is what delivery needs from the outside world (the orchestrator's upload slots and
the chain); `deliver` is the phase machine, written so that running it again after a crash at
any point finishes the file without a second upload slot being wasted on a stored file and
without a second submission.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Protocol

from meshrl.worker.outbox import Outbox, OutboxEntry, is_stale

__all__ = ["Courier", "DuplicateSubmission", "RefusedFile", "RetryLater", "StaleFile", "deliver",
           "deliver_all"]

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


async def deliver(outbox: Outbox, entry: OutboxEntry, courier: Courier, pool_step: int,
                  async_level: int, pause: Pause = _no_pause) -> Outcome:
    """Finish one outbox entry from whatever phase a previous run left it in."""
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


async def deliver_all(outbox: Outbox, courier: Courier, pool_step: int,
                      async_level: int, pause: Pause = _no_pause) -> dict[str, int]:
    """Deliver every pending entry, oldest first; counts of each outcome."""
    counts = {"sent": 0, "dropped": 0}
    for entry in outbox.pending():
        counts[await deliver(outbox, entry, courier, pool_step, async_level, pause)] += 1
    return counts
