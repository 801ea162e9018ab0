"""The verdict vocabulary: one finding type, one decision type, and how findings decide.

- A `Finding` is one failed check: which (`Check`), how serious (`Severity`), why, with the
  numbers behind it.
- `hard`: the worker's own claim contradicts what anyone can recompute (evidence of cheating:
  slash and eject). `soft`: the file is unusable, nobody is punished.
- `decide` turns findings into one `Decision`: hard beats soft beats accept.
- The validator's own failures (a download, a policy version it cannot fetch, a bug of its own)
  are never findings: they are retried and end, at worst, in `give_up`'s soft verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from meshrl.wire.models import VerdictKind

__all__ = ["Check", "Decision", "Finding", "Severity", "VerdictKind", "decide", "give_up"]


class Severity(StrEnum):
    HARD = "hard"
    SOFT = "soft"


class Check(StrEnum):
    """Every check a validator makes of a rollout file, cheapest first."""

    SHA256 = "sha256"
    SCHEMA = "schema"
    TOKENS = "tokens"
    NODE = "node"
    SLOT_CLAIM = "slot_claim"
    WORK_UNITS = "work_units"
    RULES = "rules"
    SAMPLING_SEED = "sampling_seed"
    COUNTER = "counter"
    PROMPTS = "prompts"
    SEQ_IDS = "seq_ids"
    REWARDS = "rewards"
    TERMINATION = "termination"
    EPISODE = "episode"  # an episode's turns and tool outputs, re-run (issue #45)
    SAMPLING = "sampling"
    LOGPROBS = "logprobs"
    TOPLOC = "toploc"
    VALIDATOR_ERROR = "validator_error"


@dataclass(frozen=True)
class Finding:
    """One failed check: which, how serious, why (with the numbers)."""

    check: Check
    severity: Severity
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        return f"{self.check.value}: {self.reason}"


@dataclass(frozen=True)
class Decision:
    """What a validator does with a file: accept it, or invalidate it softly or hard."""

    kind: VerdictKind
    reason: str
    checks: tuple[Check, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)  # the numbers behind it (replay)

    @property
    def accepted(self) -> bool:
        return self.kind is VerdictKind.ACCEPT


def decide(findings: list[Finding], stats: dict[str, Any] | None = None) -> Decision:
    """hard beats soft beats accept; the reason lists the failed checks of that severity first."""
    stats = stats or {}
    if not findings:
        return Decision(VerdictKind.ACCEPT, "all checks passed", (), stats)
    hard = [f for f in findings if f.severity is Severity.HARD]
    kind = VerdictKind.HARD_INVALID if hard else VerdictKind.SOFT_INVALID
    ordered = hard + [f for f in findings if f.severity is not Severity.HARD]
    return Decision(kind, "; ".join(f.text() for f in ordered), tuple(f.check for f in ordered),
                    stats)


def give_up(error: str, attempts: int) -> Decision:
    """After the validator's own failures: a soft invalidation, never a slash."""
    return Decision(VerdictKind.SOFT_INVALID, f"validator could not judge the file after "
                    f"{attempts} attempts: {error}", (Check.VALIDATOR_ERROR,))
