"""Synthetic arithmetic: `a<op>b=` with the exact integer result as answer."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.tasks.base import Problem, Task

__all__ = ["ArithmeticConfig", "ArithmeticTask"]


class ArithmeticConfig(Config):
    type: Literal["arithmetic"] = "arithmetic"
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    digits: int = Field(2, ge=1, le=9, description="max digits per operand")
    min_digits: int = Field(1, ge=1, le=9, description="min digits per operand")
    operators: str = Field("+", description="operators to draw from, any of '+-*'")
    non_negative: bool = Field(True, description="order operands of '-' so results are >= 0")

    @field_validator("operators")
    @classmethod
    def _known_ops(cls, v: str) -> str:
        if not v or set(v) - set("+-*"):
            raise ValueError(f"operators must be a non-empty subset of '+-*', got {v!r}")
        return v

    def build(self) -> ArithmeticTask:
        return ArithmeticTask(self)


class ArithmeticTask(Task):
    name = "arithmetic"

    def __init__(self, cfg: ArithmeticConfig | None = None) -> None:
        self.cfg = cfg or ArithmeticConfig()
        if self.cfg.min_digits > self.cfg.digits:
            raise ValueError("arithmetic: min_digits exceeds digits")

    def _operand(self, rng: random.Random) -> int:
        lo = 0 if self.cfg.min_digits == 1 else 10 ** (self.cfg.min_digits - 1)
        return rng.randint(lo, 10**self.cfg.digits - 1)

    def sample(self, rng: random.Random) -> Problem:
        a, b = self._operand(rng), self._operand(rng)
        op = rng.choice(self.cfg.operators)
        if op == "-" and self.cfg.non_negative and b > a:
            a, b = b, a
        result = a + b if op == "+" else a - b if op == "-" else a * b
        return Problem(self.name, f"{a}{op}{b}=", str(result))

    def score(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0
