"""What the validator does when it is itself the problem: retry with backoff.

The validator's own failures (a download error, a policy version shardcast does not have yet,
an exception in its own code) are never findings: the file is retried with exponential backoff
and, when the attempts run out, soft-invalidated at most (`meshrl.pool.give_up`), with the
error as reason. How findings decide a verdict is `meshrl.pool.decide`.
"""

from __future__ import annotations

import random

from pydantic import Field

from meshrl.config import Config

__all__ = ["RetryConfig", "backoff_delay"]


class RetryConfig(Config):
    max_attempts: int = Field(6, ge=1, description="tries per file before it is soft-invalidated")
    backoff: float = Field(1.0, gt=0, description="first retry delay (s), doubled per attempt")
    max_backoff: float = Field(60.0, gt=0, description="largest retry delay (s)")
    jitter: float = Field(0.1, ge=0, le=1, description="random fraction added to each delay")


def backoff_delay(attempt: int, cfg: RetryConfig, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (1-based): backoff * 2^(attempt-1), capped, jittered."""
    base = min(cfg.max_backoff, cfg.backoff * 2 ** max(0, attempt - 1))
    return base * (1.0 + cfg.jitter * (rng or random).random())
