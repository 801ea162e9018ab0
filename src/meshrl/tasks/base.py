"""What a verifiable task is: problems with checkable answers, and a registry of task kinds."""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from meshrl.config import InputError

__all__ = ["Problem", "RowsTask", "Task", "TaskError", "heldout_rows"]

# True in the scoring child (`meshrl.tasks.scoring_child`), which builds tasks to score rows
# and never runs their tools: a task may skip there what only running them needs (a tool's
# sandbox, which the child's own sandbox cannot nest)
SCORING_ONLY = False


class TaskError(InputError):
    """A task that cannot be built from its config (its data, its name, its package): raised
    when the mix is built, one line naming the problem, exit status 2."""


@dataclass(frozen=True)
class Problem:
    """One prompt with the reference answer its verifier checks against."""

    task: str
    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A family of problems: draws one from an RNG and scores a completion in [0, 1]."""

    name: str
    # an agentic task's episode rules (`meshrl.tasks.tools.EpisodeConfig`) and built tools;
    # None: one reply per prompt
    episode: Any = None
    tools: Any = None

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """Draw a problem using only `rng` (so sampling is reproducible by validators)."""

    def sample_heldout(self, rng: random.Random) -> Problem:
        """Draw an evaluation problem. A task over a fixed set of rows keeps some apart for
        this; a procedural task draws as in training (its held-out set is another seed)."""
        return self.sample(rng)

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """1.0 for a correct completion, 0.0 for a wrong one (partial credit where defined)."""

    def killable(self) -> tuple[dict[str, Any], float] | None:
        """(this task's config as JSON, the deadline of one row's score) when its scorer runs
        code that may hang or blow up memory on a crafted completion: every role then scores
        it in the killable child (`meshrl.tasks.killable`, `task_reward`), a row past the
        deadline scoring 0. None: `score` is safe to run in the caller's process (bounded
        work meshrl wrote, or a scorer that bounds itself: math-verify, the code sandbox)."""
        return None

    def scores_in_child(self) -> bool:
        """Whether this task's scores run in the killable child (`killable()`, or math-verify):
        building a mix with one checks the child's sandbox (`check_scoring_sandbox`)."""
        return self.killable() is not None

    def runs_answer_code(self) -> bool:
        """Whether scoring a completion may run code the completion chose (sympy's
        `parse_expr` evals its text): the scoring child then scores each row in a process
        forked for it, so a row cannot change how later rows score. True unless a task knows
        better: forking costs tens of milliseconds a row."""
        return True

    def warm(self, problem: Problem) -> None:
        """Trusted work for `problem` before a completion is scored (no completion involved):
        the scoring child does it before forking the row's process, so it is done once."""
        return None


def heldout_rows(n: int, fraction: float, salt: str) -> set[int]:
    """Indices of the held-out rows: those whose hash of (salt, index) falls below `fraction`
    (at least one row when `fraction` > 0 and at least one row is left to train on)."""
    if fraction <= 0 or n < 2:
        return set()

    def u(i: int) -> float:
        h = hashlib.sha256(f"meshrl/heldout|{salt}|{i}".encode()).digest()[:8]
        return int.from_bytes(h, "big") / 2**64

    held = {i for i in range(n) if u(i) < fraction}
    if not held:
        held = {min(range(n), key=u)}
    if len(held) == n:
        held.discard(max(held, key=u))
    return held


class RowsTask(Task):
    """A task over a fixed list of rows, some held out for evaluation: a subclass calls
    `split_rows` once it has its rows and turns an index into a problem (`problem_at`)."""

    train: list[int]
    heldout: list[int]

    def split_rows(self, n: int, fraction: float) -> None:
        """Training rows and held-out rows (the training rows again when none is held out)."""
        held = heldout_rows(n, fraction, self.name)
        self.train = [i for i in range(n) if i not in held]
        self.heldout = sorted(held) or self.train

    @abstractmethod
    def problem_at(self, index: int) -> Problem:
        """The problem of row `index`."""

    def sample(self, rng: random.Random) -> Problem:
        return self.problem_at(self.train[rng.randrange(len(self.train))])

    def sample_heldout(self, rng: random.Random) -> Problem:
        return self.problem_at(self.heldout[rng.randrange(len(self.heldout))])
