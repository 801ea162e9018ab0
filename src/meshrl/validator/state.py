"""The validator's persisted progress: the chain block cursor, queued files and judged files.

Saved atomically (temporary file, fsync, rename) after every change, so a validator killed at
any point resumes where it was: blocks before `next_block` have had all their `WorkSubmitted`
events queued, queued files are judged (or retried) after a restart, and a judged file is never
judged again. A verdict is recorded here only after its on-chain transaction (if any) is mined;
a crash in between is covered by reading the work item's on-chain status before acting.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Job", "ValidatorState"]


@dataclass
class Job:
    """One submitted file to judge."""

    sha256: str
    node: str
    provider: str
    pool: int
    units: int
    block: int
    attempts: int = 0
    not_before: float = 0.0
    last_error: str = ""


@dataclass
class ValidatorState:
    path: Path
    next_block: int = 0
    queue: list[Job] = field(default_factory=list)
    judged: dict[str, str] = field(default_factory=dict)  # sha256 -> verdict kind

    @classmethod
    def load(cls, path: str | Path, start_block: int) -> ValidatorState:
        path = Path(path)
        if not path.is_file():
            return cls(path, start_block)
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(path, int(data["next_block"]), [Job(**j) for j in data["queue"]],
                   dict(data["judged"]))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"next_block": self.next_block, "queue": [asdict(j) for j in self.queue],
                "judged": self.judged}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def enqueue(self, jobs: list[Job], next_block: int) -> None:
        """Queue new submissions (skipping judged / queued ones) and advance the cursor, at once."""
        known = self.judged.keys() | {j.sha256 for j in self.queue}
        self.queue += [j for j in jobs if j.sha256 not in known]
        self.next_block = next_block
        self.save()

    def record(self, job: Job, verdict: str) -> None:
        self.queue = [j for j in self.queue if j.sha256 != job.sha256]
        self.judged[job.sha256] = verdict
        self.save()
