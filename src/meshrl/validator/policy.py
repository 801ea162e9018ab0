"""From findings to a verdict, and what the validator does when it is itself the problem.

- Any `hard` finding (the worker's own claims contradict a recomputation) is a hard
  invalidation: slash and eject. Any `soft` finding alone is a soft invalidation: the file is
  unusable, nobody is punished.
- The validator's own failures (a download error, a policy version shardcast does not have yet,
  an exception in its own code) are never findings: the file is retried with exponential backoff
  and, when the attempts run out, soft-invalidated at most (`give_up`), with the error as reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.validator.checks import Finding

__all__ = ["Decision", "RetryConfig", "backoff_delay", "decide", "give_up"]

Kind = Literal["accept", "soft", "hard"]


class RetryConfig(Config):
    max_attempts: int = Field(6, ge=1, description="tries per file before it is soft-invalidated")
    backoff: float = Field(1.0, gt=0, description="first retry delay (s), doubled per attempt")
    max_backoff: float = Field(60.0, gt=0, description="largest retry delay (s)")
    jitter: float = Field(0.1, ge=0, le=1, description="random fraction added to each delay")


@dataclass(frozen=True)
class Decision:
    kind: Kind
    reason: str
    checks: tuple[str, ...] = ()

    @classmethod
    def from_findings(cls, findings: list[Finding]) -> Decision:
        return decide(findings)


def decide(findings: list[Finding]) -> Decision:
    """hard beats soft beats accept; the reason lists the failed checks of that severity first."""
    if not findings:
        return Decision("accept", "all checks passed")
    hard = [f for f in findings if f.severity == "hard"]
    kind: Kind = "hard" if hard else "soft"
    ordered = hard + [f for f in findings if f.severity != "hard"]
    return Decision(kind, "; ".join(f.text() for f in ordered),
                    tuple(f.check for f in ordered))


def give_up(error: str, attempts: int) -> Decision:
    """After the validator's own failures: a soft invalidation, never a slash."""
    return Decision("soft", f"validator could not judge the file after {attempts} attempts: "
                    f"{error}", ("validator_error",))


def backoff_delay(attempt: int, cfg: RetryConfig, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (1-based): backoff * 2^(attempt-1), capped, jittered."""
    base = min(cfg.max_backoff, cfg.backoff * 2 ** max(0, attempt - 1))
    return base * (1.0 + cfg.jitter * (rng or random).random())
