"""What a verifiable task is: problems with checkable answers, and a registry of task kinds."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Problem", "Task"]


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
