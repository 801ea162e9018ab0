"""The validator's persisted progress: the chain block cursor, queued files and judged files.

Saved atomically (temporary file, fsync, rename) after every change, so a validator killed at
any point resumes where it was: blocks before `next_block` have had all their `WorkSubmitted`
events queued, queued files are judged (or retried) after a restart, a judged submission is
never judged again, and verdicts not yet delivered to the orchestrator are sent again. A verdict
is recorded only after its on-chain transaction (if any) is mined; a crash in between is covered
by reading the work item's on-chain status before acting.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshrl.durable import atomic_write
from meshrl.wire.models import Verdict

__all__ = ["Job", "LeafMemory", "ValidatorState"]


@dataclass
class Job:
    """One submitted file to judge (a submission: the same file by two nodes is two jobs)."""

    work_id: str
    sha256: str
    node: str
    provider: str
    pool: int
    units: int
    block: int
    block_hash: str | None = None  # of `block`: picks the rows replayed (None: every row)
    attempts: int = 0
    not_before: float = 0.0
    last_error: str = ""
    # a file of a batch (issue 46): its batch, root, leaf index, step, counter and proof (hex),
    # what `open_leaf` needs to accuse it; a job with `batch_id` and no sha256 is the batch
    # itself, whose leaves are still to be read (`ValidatorNode._expand`)
    batch_id: str = ""
    root: str = ""
    index: int = -1
    step: int = 0
    counter: int = 0
    count: int = 0
    proof: list[str] = field(default_factory=list)


@dataclass
class ValidatorState:
    path: Path
    next_block: int = 0
    queue: list[Job] = field(default_factory=list)
    judged: dict[str, str] = field(default_factory=dict)  # work id -> verdict kind
    outgoing: list[Verdict] = field(default_factory=list)  # verdicts not yet posted
    # the leaves of the batches this validator expanded, by the file's work id (hex): a Job
    # (as `asdict`) with its batch, root, index and proof, plus `until` (unix time its
    # window closes); a later `submit_work` of the same file, or the same file in another
    # batch, is opened out of it as a copy (`ValidatorNode._copies`)
    leaves: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path, start_block: int) -> ValidatorState:
        path = Path(path)
        if not path.is_file():
            return cls(path, start_block)
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(path, int(data["next_block"]), [Job(**j) for j in data["queue"]],
                   dict(data["judged"]),
                   [Verdict.model_validate(v) for v in data.get("outgoing", [])],
                   dict(data.get("leaves", {})))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"next_block": self.next_block, "queue": [asdict(j) for j in self.queue],
                "judged": self.judged,
                "outgoing": [v.model_dump(mode="json") for v in self.outgoing],
                "leaves": self.leaves}
        atomic_write(self.path, json.dumps(data))

    def enqueue(self, jobs: list[Job], next_block: int) -> None:
        """Queue new submissions (skipping judged / queued ones) and advance the cursor, at once."""
        known = self.judged.keys() | {j.work_id for j in self.queue}
        self.queue += [j for j in jobs if j.work_id not in known]
        self.next_block = next_block
        self.save()

    def first(self, work_id: str) -> None:
        """Move the queued job of `work_id` to the front (an accused file: its vote is due)."""
        self.queue.sort(key=lambda j: j.work_id != work_id)
        self.save()

    def record(self, job: Job, verdict: str, outgoing: Verdict | None = None) -> None:
        """A judged job leaves the queue; its verdict for the orchestrator is queued with it."""
        self.queue = [j for j in self.queue if j.work_id != job.work_id]
        self.judged[job.work_id] = verdict
        if outgoing is not None:
            self.outgoing.append(outgoing)
        self.save()

    def expand(self, batch: Job, leaves: list[Job], until: int = 0) -> None:
        """A batch's job becomes the jobs of its leaves, ahead of the queue, and they are
        remembered (`leaves`) until `until`, at once."""
        known = self.judged.keys() | {j.work_id for j in self.queue}
        rest = [j for j in self.queue if j.work_id != batch.work_id]
        self.queue = [j for j in leaves if j.work_id not in known] + rest
        for j in leaves:
            self.leaves.setdefault(j.work_id, {**asdict(j), "until": until})
        self.save()

    def forget_leaves(self, work_ids: list[str], now: float) -> None:
        """Leaves opened (out of their batch now) and those whose window closed by `now`."""
        gone = set(work_ids) | {w for w, x in self.leaves.items() if x["until"] <= now}
        if gone & self.leaves.keys():
            self.leaves = {w: x for w, x in self.leaves.items() if w not in gone}
            self.save()

    def posted(self, verdict: Verdict) -> None:
        self.outgoing = [v for v in self.outgoing if v != verdict]
        self.save()


class LeafMemory:
    """Where each file of a batch expanded here was a leaf, kept past its batch's window: file
    work id (hex) -> {"batch_id", "index", "block" (of `BatchSubmitted`), "until" (the batch's
    `judge_until`)}. A copy of such a file submitted after that window closed (`open_leaf` is
    refused then) is found here and invalidated as the duplicate it is
    (`ValidatorNode._duplicate`).

    Bounded against a flood: at most `cap` entries, the oldest evicted first (a copy made
    after `cap` newer leaves were seen is judged as any file). Entries come only from leaf
    lists the orchestrator served and that hash to a root on chain, i.e. files it granted and
    took uploads of, so a flood costs the pool's own work. Persisted as JSON lines
    (`leaf_memory.jsonl` beside state.json), appended once per expanded batch and rewritten
    whole when twice `cap` lines long; a torn last line (a crash mid-append) is skipped."""

    def __init__(self, path: str | Path, cap: int) -> None:
        self.path, self.cap = Path(path), cap
        self.entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.lines = 0
        torn = False
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    self.lines += 1
                    try:
                        wid, entry = json.loads(line)
                        self._put(str(wid), dict(entry))
                    except (ValueError, TypeError):
                        torn = True
        if torn:  # rewritten whole, so the next append does not join the torn line
            self._rewrite()

    def _rewrite(self) -> None:
        atomic_write(self.path, "".join(json.dumps([w, e]) + "\n"
                                        for w, e in self.entries.items()))
        self.lines = len(self.entries)

    def __contains__(self, work_id: object) -> bool:
        return work_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, work_id: str) -> dict[str, Any] | None:
        return self.entries.get(work_id)

    def _put(self, work_id: str, entry: dict[str, Any]) -> None:
        if self.cap <= 0:
            return
        self.entries.pop(work_id, None)
        self.entries[work_id] = entry
        while len(self.entries) > self.cap:
            self.entries.popitem(last=False)  # the oldest leaf seen

    def add(self, entries: dict[str, dict[str, Any]]) -> None:
        """Remember leaves (the first batch a file was seen in stays its entry), durably."""
        new = {w: e for w, e in entries.items() if w not in self.entries}
        if not new or self.cap <= 0:
            return
        for w, e in new.items():
            self._put(w, e)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.lines + len(new) > 2 * self.cap:
            self._rewrite()
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps([w, e]) + "\n" for w, e in new.items()))
            f.flush()
            os.fsync(f.fileno())
        self.lines += len(new)
