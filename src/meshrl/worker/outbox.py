"""The worker's outbox: finished rollout files survive crashes and are submitted exactly once.

A file goes through three phases, each recorded on disk before the next starts:
  written   - `<sha>.parquet` and its `<sha>.json` record are in the outbox (both written to a
              temporary name, fsynced, then renamed: a crash leaves either nothing or both);
  uploaded  - the orchestrator's store holds the bytes (an upload is idempotent: a store that
              already has the sha256 answers so, and the worker moves on);
  submitted - `submit_work` is on chain. Before submitting, the worker asks the chain whether
              the file is already there (a crash between sending the transaction and recording
              it), and a "duplicate" revert also counts as submitted, so a file is never
              submitted twice; its record then moves to `sent.jsonl` and the bytes to `sent/`.
              A file put by this process whose submission it never sent (`unsent`) is not
              asked about: nothing but this process could have submitted it.
A file whose policy version is older than the pool's step allows (`step - async_level`) is no
use to the trainer: it is moved to `dropped/` with the reason, never submitted.

In a pool that submits in batches (its rules' `batch.files` > 1, issue 46), an uploaded file
waits for its batch instead of being submitted alone. A batch is recorded on disk before any
of it leaves the machine: `batches/<batch id>.json` lists its files (leaf order), root and
phase, written atomically, and is the only record of which batch a file is in, so a file is in
exactly one batch. Its phases, each recorded before the next starts:
  formed    - the membership is on disk;
  posted    - the orchestrator has its leaf list (`POST /batches`, idempotent);
  submitted - `submit_batch` is on chain. Before submitting, a batch this process did not form
              is asked about on chain by its batch id (a crash after sending), and a "duplicate"
              revert also counts as sent, so a batch is submitted once; then each file is
              finished as above (`sent.jsonl` names its batch) and the batch record moves to
              `batches.jsonl`. A crash inside that finishes the rest after the restart.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from meshrl.durable import atomic_write

__all__ = ["BatchPhase", "BatchRecord", "Outbox", "OutboxEntry", "OutboxError", "Phase",
           "is_stale"]

Phase = Literal["written", "uploaded", "submitted"]
_PHASES: tuple[str, ...] = ("written", "uploaded", "submitted")
BatchPhase = Literal["formed", "posted", "submitted"]
_BATCH_PHASES: tuple[str, ...] = ("formed", "posted", "submitted")


class OutboxError(RuntimeError):
    """An outbox on disk that cannot be read or written."""


@dataclass
class OutboxEntry:
    sha256: str
    size: int
    counter: int  # at its policy version
    policy_version: int
    work_units: int
    phase: Phase = "written"
    created: float = 0.0
    tx_hash: str = ""
    slot_url: str = ""  # the upload slot granted for this file (reused after a crash)
    slot_expires: float = 0.0
    batch_id: str = ""  # the batch it was submitted in (set when it is finished)


@dataclass
class BatchRecord:
    """A batch of this node's files: their sha256s in leaf order, its root and id (hex)."""

    batch_id: str
    root: str
    files: list[str]
    phase: BatchPhase = "formed"
    created: float = 0.0
    tx_hash: str = ""


class Outbox:
    """Files waiting to be uploaded and submitted, in one directory."""

    def __init__(self, root: str | Path, keep_sent: int = 16) -> None:
        self.root = Path(root)
        self.keep_sent = keep_sent
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "dropped").mkdir(exist_ok=True)
        (self.root / "sent").mkdir(exist_ok=True)
        (self.root / "batches").mkdir(exist_ok=True)
        for tmp in [*self.root.glob(".*.tmp"), *(self.root / "batches").glob(".*.tmp")]:
            tmp.unlink(missing_ok=True)  # a write a crash interrupted: never renamed
        # files put by this process whose submission it has not sent (`sending` removes one)
        self.unsent: set[str] = set()
        self.unsent_batches: set[str] = set()  # likewise, batches formed by this process
        self._sent: dict[str, dict] | None = None  # sent.jsonl, read once, then kept up to date

    def data_path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.parquet"

    def _record_path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.json"

    def put(self, data: bytes, entry: OutboxEntry) -> OutboxEntry:
        """Store a finished file (bytes first, record last: a record always has its bytes)."""
        entry.created = entry.created or time.time()
        atomic_write(self.data_path(entry.sha256), data)
        self._save(entry)
        self.unsent.add(entry.sha256)
        return entry

    def sending(self, entry: OutboxEntry) -> None:
        """Its submission is about to be sent: from now on it may be on chain unrecorded."""
        self.unsent.discard(entry.sha256)

    def _save(self, entry: OutboxEntry) -> None:
        atomic_write(self._record_path(entry.sha256), json.dumps(asdict(entry)).encode())

    def pending(self) -> list[OutboxEntry]:
        """Entries not yet finished, oldest first (bytes without a record are a crashed put)."""
        out = []
        for rec in self.root.glob("*.json"):
            try:
                fields = json.loads(rec.read_text())
                fields.pop("step", None)  # written before issue #44: its policy version
                entry = OutboxEntry(**fields)
            except (OSError, ValueError, TypeError) as e:
                raise OutboxError(f"outbox record {rec} is unreadable: {e}") from None
            if entry.phase not in _PHASES:
                raise OutboxError(f"outbox record {rec} has unknown phase {entry.phase!r}")
            if not self.data_path(entry.sha256).is_file():
                raise OutboxError(f"outbox record {rec} has no file")
            out.append(entry)
        for orphan in self.root.glob("*.parquet"):
            if not self._record_path(orphan.stem).is_file():
                orphan.unlink()
        return sorted(out, key=lambda e: (e.created, e.sha256))

    def __iter__(self) -> Iterator[OutboxEntry]:
        return iter(self.pending())

    def __len__(self) -> int:
        return len(list(self.root.glob("*.json")))

    def mark(self, entry: OutboxEntry, phase: Phase, tx_hash: str = "") -> None:
        entry.phase = phase
        entry.tx_hash = tx_hash or entry.tx_hash
        self._save(entry)

    def set_slot(self, entry: OutboxEntry, url: str, expires: float) -> None:
        entry.slot_url, entry.slot_expires = url, expires
        self._save(entry)

    def finish(self, entry: OutboxEntry) -> None:
        """A submitted file leaves the outbox: its record is appended to `sent.jsonl` and its
        bytes kept in `sent/` (the newest `keep_sent`, evidence in a dispute)."""
        record = asdict(entry)
        self._append("sent.jsonl", record)
        if self._sent is not None:
            self._sent[entry.sha256] = record
        self.unsent.discard(entry.sha256)
        data = self.data_path(entry.sha256)
        if data.is_file():
            os.replace(data, self.root / "sent" / data.name)
        self._record_path(entry.sha256).unlink(missing_ok=True)
        kept = sorted((self.root / "sent").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
        for old in kept[: max(0, len(kept) - self.keep_sent)]:
            old.unlink(missing_ok=True)

    def drop(self, entry: OutboxEntry, reason: str) -> None:
        """A file that must not be submitted (stale) moves to `dropped/` with its reason."""
        self._append("dropped.jsonl", {**asdict(entry), "reason": reason})
        shutil.move(self.data_path(entry.sha256), self.root / "dropped" / f"{entry.sha256}.parquet")
        self._record_path(entry.sha256).unlink(missing_ok=True)
        self.unsent.discard(entry.sha256)

    def sent(self) -> list[dict]:
        """Submitted files, once each (a crash inside `finish` may have logged one twice).
        Read from disk once per process (it grows with every file; the worker asks before
        each file), then kept in memory."""
        if self._sent is None:
            self._sent = {r["sha256"]: r for r in self._read("sent.jsonl")}
        return list(self._sent.values())

    def dropped(self) -> list[dict]:
        return self._read("dropped.jsonl")

    def _append(self, name: str, record: dict) -> None:
        with open(self.root / name, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _read(self, name: str) -> list[dict]:
        path = self.root / name
        if not path.is_file():
            return []
        # a crash may cut the last line short; it is the only line that can be partial
        return [json.loads(line) for line in path.read_text().splitlines()
                if line.strip().endswith("}")]


    # batches
    def _batch_path(self, batch_id: str) -> Path:
        return self.root / "batches" / f"{batch_id}.json"

    def batches(self) -> list[BatchRecord]:
        """Batches not yet finished, oldest first."""
        out = []
        for rec in (self.root / "batches").glob("*.json"):
            try:
                b = BatchRecord(**json.loads(rec.read_text()))
            except (OSError, ValueError, TypeError) as e:
                raise OutboxError(f"outbox batch {rec} is unreadable: {e}") from None
            if b.phase not in _BATCH_PHASES:
                raise OutboxError(f"outbox batch {rec} has unknown phase {b.phase!r}")
            out.append(b)
        return sorted(out, key=lambda b: (b.created, b.batch_id))

    def batched(self) -> set[str]:
        """The files in a batch not yet finished (each in exactly one)."""
        return {sha for b in self.batches() for sha in b.files}

    def form_batch(self, batch_id: str, root: str, files: list[str]) -> BatchRecord:
        """Record a batch's membership (before anything of it is sent)."""
        taken = self.batched() & set(files)
        if taken:
            raise OutboxError(f"files already in a batch: {sorted(taken)}")
        b = BatchRecord(batch_id, root, list(files), "formed", time.time())
        self._save_batch(b)
        self.unsent_batches.add(batch_id)
        return b

    def _save_batch(self, b: BatchRecord) -> None:
        atomic_write(self._batch_path(b.batch_id), json.dumps(asdict(b)).encode())

    def mark_batch(self, b: BatchRecord, phase: BatchPhase, tx_hash: str = "") -> None:
        b.phase = phase
        b.tx_hash = tx_hash or b.tx_hash
        self._save_batch(b)

    def sending_batch(self, b: BatchRecord) -> None:
        """Its submission is about to be sent: from now on it may be on chain unrecorded."""
        self.unsent_batches.discard(b.batch_id)

    def finish_batch(self, b: BatchRecord) -> None:
        """A submitted batch's files leave the outbox (each `finish`ed, naming the batch; one
        finished before a crash is skipped), then the batch record itself."""
        entries = {e.sha256: e for e in self.pending()}
        for sha in b.files:
            e = entries.get(sha)
            if e is not None:
                e.phase, e.batch_id, e.tx_hash = "submitted", b.batch_id, b.tx_hash
                self.finish(e)
        self._append("batches.jsonl", asdict(b))
        self._batch_path(b.batch_id).unlink(missing_ok=True)
        self.unsent_batches.discard(b.batch_id)

    def drop_batch(self, b: BatchRecord, reason: str) -> None:
        """A batch never sent whose files must not be submitted: they are dropped with it."""
        entries = {e.sha256: e for e in self.pending()}
        for sha in b.files:
            if sha in entries:
                self.drop(entries[sha], reason)
        self._append("batches.jsonl", {**asdict(b), "dropped": reason})
        self._batch_path(b.batch_id).unlink(missing_ok=True)
        self.unsent_batches.discard(b.batch_id)


def is_stale(policy_version: int, pool_step: int, async_level: int) -> bool:
    """The trainer uses rollouts of policy versions >= step - async_level only."""
    return policy_version < pool_step - async_level
