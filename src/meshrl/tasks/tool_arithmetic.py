"""Arithmetic a tiny model cannot do alone but can with a calculator: `a*b=` of 4-digit
operands, answered in episodes with the `calc` tool (`meshrl.tasks.tools`).

The answer is what the model writes after the last tool output (`</result>`), or its whole
reply when it called no tool: writing the product inside a call earns nothing, copying the
calculator's output does.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.base import Problem, Task
from meshrl.tasks.tools import EpisodeConfig, Tool

__all__ = ["ToolArithmeticConfig", "ToolArithmeticTask", "final_answer"]


class ToolArithmeticConfig(Config):
    type: Literal["tool_arithmetic"] = "tool_arithmetic"
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    digits: int = Field(4, ge=1, le=9, description="digits per operand")
    operators: str = Field("*", pattern=r"^[+\-*]+$", description="operators to draw from")
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig, description="tools and "
                                   "limits of the episodes")

    def build(self) -> ToolArithmeticTask:
        return ToolArithmeticTask(self)


def final_answer(completion: str, close: str = "</result>") -> str:
    """The text after the last tool output (the whole text when there is none), stripped."""
    return completion.rsplit(close, 1)[-1].strip()


class ToolArithmeticTask(Task):
    name = "tool_arithmetic"

    def __init__(self, cfg: ToolArithmeticConfig | None = None) -> None:
        self.cfg = cfg or ToolArithmeticConfig()
        self.tools: list[Tool] = self.cfg.episode.build()  # refuses unreplayable tools here
        self.episode = self.cfg.episode

    def sample(self, rng: random.Random) -> Problem:
        lo, hi = 10 ** (self.cfg.digits - 1), 10**self.cfg.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        op = rng.choice(self.cfg.operators)
        result = a + b if op == "+" else a - b if op == "-" else a * b
        return Problem(self.name, f"{a}{op}{b}=", str(result))

    def warm_start_trace(self, problem: Problem) -> list[str]:
        """The model turns of a tool-use trace for the supervised warm start: a call of the
        calculator on the problem, then the answer (the tool's output comes between)."""
        return [f"<calc>{problem.prompt.rstrip('=')}</calc>", problem.answer]

    def score(self, problem: Problem, completion: str) -> float:
        close = self.cfg.episode.result_template.rsplit("{output}", 1)[-1] or "</result>"
        return 1.0 if final_answer(completion, close) == problem.answer else 0.0
