"""Reverse a random string: `rev:abc=` -> `cba`."""

from __future__ import annotations

import random
import string
from typing import Literal

from pydantic import Field, model_validator

from meshrl.config import Config
from meshrl.tasks.base import Problem, Task

__all__ = ["ReverseConfig", "ReverseTextTask"]


class ReverseConfig(Config):
    type: Literal["reverse"] = "reverse"
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    min_length: int = Field(3, ge=1)
    max_length: int = Field(8, ge=1)
    alphabet: str = Field(string.ascii_lowercase, min_length=2)

    @model_validator(mode="after")
    def _lengths(self) -> ReverseConfig:
        if self.min_length > self.max_length:
            raise ValueError("reverse: min_length exceeds max_length")
        return self

    def build(self) -> ReverseTextTask:
        return ReverseTextTask(self)


class ReverseTextTask(Task):
    name = "reverse"

    def __init__(self, cfg: ReverseConfig | None = None) -> None:
        self.cfg = cfg or ReverseConfig()

    def sample(self, rng: random.Random) -> Problem:
        n = rng.randint(self.cfg.min_length, self.cfg.max_length)
        text = "".join(rng.choice(self.cfg.alphabet) for _ in range(n))
        return Problem(self.name, f"rev:{text}=", text[::-1])

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0
