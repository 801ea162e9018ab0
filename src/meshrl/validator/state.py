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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshrl.durable import atomic_write
from meshrl.wire.models import Verdict

__all__ = ["Job", "ValidatorState"]


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
