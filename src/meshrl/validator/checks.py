"""The validator's checks, as pure functions: each returns None (pass) or a `Finding`.

A finding names its check, says whether it is evidence of cheating (`hard`: the worker's own
claim contradicts what anyone can recompute) or only makes the file unusable (`soft`), and
carries the numbers behind the decision. The model-dependent checks (sampling replay,
termination, log-probs, TOPLOC) are in `replay.py`; these need no model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Finding",
    "check_node",
    "check_policy_version",
    "check_prompts",
    "check_rewards",
    "check_sampling_params",
    "check_sha256",
    "check_slot_claim",
    "check_work_units",
]

Severity = Literal["hard", "soft"]


@dataclass(frozen=True)
class Finding:
    """One failed check: which, how serious, why (with the numbers)."""

    check: str
    severity: Severity
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        return f"{self.check}: {self.reason}"


def check_sha256(data: bytes, on_chain: str) -> Finding | None:
    """The downloaded bytes hash to the sha256 submitted on chain.

    Soft: a mismatch may be a broken download or store (the validator's side), so it is retried
    and never slashed; a worker cannot profit from it since the file is never accepted.
    """
    got = hashlib.sha256(data).hexdigest()
    if got == on_chain.lower().removeprefix("0x"):
        return None
    return Finding("sha256", "soft", f"downloaded file hashes to {got[:16]}..., chain has "
                   f"{on_chain[:16]}...", {"got": got, "chain": on_chain, "bytes": len(data)})


def check_node(file_node: str, file_provider: str, chain_node: str,
               chain_provider: str) -> Finding | None:
    """The file names the node and provider that submitted it on chain (a copy names another)."""
    if file_node.lower() == chain_node.lower() and file_provider.lower() == chain_provider.lower():
        return None
    return Finding("node", "hard", f"file is of node {file_node} / provider {file_provider}, "
                   f"submitted by node {chain_node} / provider {chain_provider}",
                   {"file_node": file_node, "chain_node": chain_node})


def check_work_units(claimed_file: int, claimed_chain: int, prompt_lens: Sequence[int],
                     completion_lens: Sequence[int]) -> Finding | None:
    """Units claimed (in the file and on chain) equal the tokens processed."""
    tokens = sum(prompt_lens) + sum(completion_lens)
    if claimed_file == tokens and claimed_chain == tokens:
        return None
    return Finding("work_units", "hard", f"claims {claimed_chain} units on chain and "
                   f"{claimed_file} in the file for {tokens} tokens processed",
                   {"chain": claimed_chain, "file": claimed_file, "tokens": tokens})


def check_prompts(claimed: Sequence[Sequence[int]], assigned: Sequence[Sequence[int]],
                  group_size: int) -> Finding | None:
    """Row r holds the prompt assigned at index r // group_size, and every assigned prompt has
    exactly `group_size` rows."""
    want = [list(p) for p in assigned for _ in range(group_size)]
    if len(claimed) != len(want):
        return Finding("prompts", "hard", f"{len(claimed)} rows for {len(assigned)} assigned "
                       f"prompts x {group_size}", {"rows": len(claimed), "expected": len(want)})
    bad = [r for r, (c, w) in enumerate(zip(claimed, want, strict=True)) if list(c) != w]
    if not bad:
        return None
    return Finding("prompts", "hard", f"{len(bad)} of {len(want)} rows hold prompts the node "
                   f"was not assigned, first row {bad[0]}", {"bad_rows": len(bad),
                                                            "first": bad[0]})


def check_policy_version(version: int, step: int, async_level: int) -> Finding | None:
    """step - async_level <= version <= step (the trainer's async rule)."""
    if step - async_level <= version <= step:
        return None
    return Finding("policy_version", "hard", f"version {version} for step {step} is outside "
                   f"[{step - async_level}, {step}] (async_level {async_level})",
                   {"version": version, "step": step, "async_level": async_level})


def check_sampling_params(claimed: dict[str, Any], ordered: dict[str, Any],
                          seed: int, expected_seed: int) -> Finding | None:
    """The file's sampling parameters and sampler seed are the work order's."""
    diffs = {k: (claimed.get(k), v) for k, v in ordered.items() if claimed.get(k) != v}
    if seed != expected_seed:
        diffs["seed"] = (seed, expected_seed)
    if not diffs:
        return None
    text = ", ".join(f"{k} {a!r} != {b!r}" for k, (a, b) in sorted(diffs.items()))
    return Finding("sampling_params", "hard", f"file differs from the work order: {text}",
                   {k: str(v) for k, v in diffs.items()})


def check_rewards(claimed: Sequence[float], recomputed: Sequence[float],
                  atol: float = 1e-6) -> Finding | None:
    """Every claimed reward equals the task verifier's re-run."""
    if len(claimed) != len(recomputed):
        return Finding("rewards", "hard", f"{len(claimed)} rewards for {len(recomputed)} rows")
    bad = [i for i, (c, r) in enumerate(zip(claimed, recomputed, strict=True))
           if not (math.isfinite(c) and abs(c - r) <= atol)]
    if not bad:
        return None
    i = bad[0]
    return Finding("rewards", "hard", f"{len(bad)} of {len(claimed)} rewards differ from the "
                   f"verifier, first row {i}: claims {claimed[i]}, recomputed {recomputed[i]}",
                   {"bad_rows": len(bad), "claimed_sum": float(sum(claimed)),
                    "recomputed_sum": float(sum(recomputed))})


def check_slot_claim(file_claim: dict[str, int], slot_claim: dict[str, int]) -> Finding | None:
    """The file says what its node declared in the signed upload-slot request (step, policy
    version, work units): the orchestrator granted the slot only for a version inside the
    window, so a file of another version lied to it."""
    diffs = {k: (file_claim.get(k), v) for k, v in slot_claim.items() if file_claim.get(k) != v}
    if not diffs:
        return None
    text = ", ".join(f"{k} {a} in the file, {b} in the slot request"
                     for k, (a, b) in sorted(diffs.items()))
    return Finding("slot_claim", "hard", text, {k: f"{a}/{b}" for k, (a, b) in diffs.items()})
