"""The worker's real `Courier`: upload slots on the orchestrator, `submit_work` on chain (or,
in a pool that batches, the batch's leaves posted to the orchestrator and `submit_batch`).

Uploads are made resumable by remembering the granted slot in the outbox record before the
upload starts: after a crash the same slot is used again; `SlotAlreadyUsed` (or, for a new
grant, `FileAlreadyUploaded`) means the bytes arrived before the crash, `UploadInProgress` that
a previous connection still holds the slot (`RetryLater`). The orchestrator grants this node's
unstored file again whenever asked, so a lost grant costs nothing. A file whose counter is used
by another file, or that is known as another node's, can never be delivered: it is dropped.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from eth_account.signers.local import LocalAccount

from meshrl.protocol import DuplicateFile, Protocol, WorkStatus
from meshrl.protocol.batches import Batch
from meshrl.wire import (
    BadLeaf,
    BatchMismatch,
    BatchTooLarge,
    CounterOutOfRange,
    CounterUsed,
    FileAlreadyKnown,
    FileAlreadyUploaded,
    FileInAnotherBatch,
    NoSuchSlot,
    SignedClient,
    SlotAlreadyUsed,
    SlotExpired,
    StaleWork,
    UploadInProgress,
)
from meshrl.wire.models import BatchInfo, BatchLeaf, BatchPost, SlotRequest, UploadSlot
from meshrl.worker.delivery import DuplicateSubmission, Pause, RefusedFile, RetryLater, StaleFile
from meshrl.worker.outbox import Outbox, OutboxEntry

__all__ = ["ChainCourier"]


class ChainCourier:
    def __init__(self, orch: SignedClient, chain: Protocol, provider: LocalAccount,
                 node: str, pool: int, outbox: Outbox, pause: Pause | None = None) -> None:
        self.orch, self.chain, self.node, self.pool = orch, chain.as_(provider), node, pool
        self.outbox = outbox
        self.pause = pause

    async def upload(self, entry: OutboxEntry, path: Path) -> None:
        if entry.slot_url and entry.slot_expires > time.time():
            try:
                await self.orch.upload("PUT", entry.slot_url, path, entry.sha256)
                return
            except SlotAlreadyUsed:
                return  # it arrived before a crash
            except UploadInProgress:
                raise RetryLater("an upload through this slot is still running") from None
            except (NoSuchSlot, SlotExpired):
                pass  # ask for a new slot
        req = SlotRequest(sha256=entry.sha256, size=entry.size,
                          policy_version=entry.policy_version, work_units=entry.work_units,
                          counter=entry.counter)
        try:
            slot = await self.orch.call("POST", "/uploads", req, response=UploadSlot)
        except FileAlreadyUploaded:
            return  # stored through a slot granted before a crash
        except StaleWork as e:
            raise StaleFile(e.detail) from None
        except (CounterUsed, CounterOutOfRange, FileAlreadyKnown) as e:
            raise RefusedFile(str(e)) from None
        self.outbox.set_slot(entry, slot.url, slot.expires_at)
        if self.pause is not None:
            await self.pause("slot-granted", entry)
        try:
            await self.orch.upload(slot.method, slot.url, path, entry.sha256)
        except UploadInProgress:
            raise RetryLater("an upload through this slot is still running") from None

    async def submitted(self, entry: OutboxEntry) -> bool:
        wid = Protocol.work_id(self.node, bytes.fromhex(entry.sha256))
        info = await asyncio.to_thread(self.chain.work, wid)
        return info.status != WorkStatus.NONE

    async def submit(self, entry: OutboxEntry) -> str:
        try:
            r = await asyncio.to_thread(self.chain.submit_work, self.pool, self.node,
                                        bytes.fromhex(entry.sha256), entry.work_units)
        except DuplicateFile as e:
            raise DuplicateSubmission(str(e)) from None
        return r.tx_hash

    async def post_batch(self, batch: Batch) -> None:
        body = BatchPost(leaves=[BatchLeaf(sha256=x.file_sha256.hex(), work_units=x.units,
                                           step=x.step, counter=x.counter)
                                 for x in batch.leaves])
        try:
            got = await self.orch.call("POST", "/batches", body, response=BatchInfo)
        except (BadLeaf, FileInAnotherBatch, BatchTooLarge, BatchMismatch) as e:
            raise RefusedFile(str(e)) from None
        if got.batch_id != batch.id.hex():  # the orchestrator hashed other leaves: never sent
            raise RefusedFile(f"orchestrator named batch {got.batch_id}, not {batch.id.hex()}")

    async def batch_submitted(self, batch_id: bytes) -> bool:
        info = await asyncio.to_thread(self.chain.work, batch_id)
        return info.status != WorkStatus.NONE

    async def submit_batch(self, batch: Batch) -> str:
        try:
            r = await asyncio.to_thread(self.chain.submit_batch, self.pool, self.node,
                                        batch.root, batch.count, batch.units)
        except DuplicateFile as e:
            raise DuplicateSubmission(str(e)) from None
        return r.tx_hash
