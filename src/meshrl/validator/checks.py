"""The validator's checks, as pure functions: each returns None (pass) or a `Finding`.

A finding (`meshrl.pool.Finding`) names its check, says whether it is evidence of cheating
(`hard`: the worker's own claim contradicts what anyone can recompute) or only makes the file
unusable (`soft`), and carries the numbers behind the decision. These need no model; the
checks on the recomputed logits and hidden states (sampling replay, log-probs, TOPLOC) are in
`replay.py`, which also applies `check_termination` with the context of its engine. They are
the only checks that judge a rollout: `meshrl.toploc` keeps the proofs and their thresholds.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from meshrl.pool.assignment import work_units
from meshrl.pool.rules import PoolRules
from meshrl.pool.verdicts import Check, Finding, Severity

__all__ = [
    "check_header_rules",
    "check_node",
    "check_prompts",
    "check_rewards",
    "check_sampling_seed",
    "check_sha256",
    "check_slot_claim",
    "check_termination",
    "check_work_units",
    "row_termination",
]

HARD, SOFT = Severity.HARD, Severity.SOFT


def check_sha256(data: bytes, on_chain: str) -> Finding | None:
    """The downloaded bytes hash to the sha256 submitted on chain.

    Soft: a mismatch may be a broken download or store (the validator's side), so it is retried
    and never slashed; a worker cannot profit from it since the file is never accepted.
    """
    got = hashlib.sha256(data).hexdigest()
    if got == on_chain.lower().removeprefix("0x"):
        return None
    return Finding(Check.SHA256, SOFT, f"downloaded file hashes to {got[:16]}..., chain has "
                   f"{on_chain[:16]}...", {"got": got, "chain": on_chain, "bytes": len(data)})


def check_node(file_node: str, file_provider: str, chain_node: str,
               chain_provider: str) -> Finding | None:
    """The file names the node and provider that submitted it on chain (a copy names another)."""
    if file_node.lower() == chain_node.lower() and file_provider.lower() == chain_provider.lower():
        return None
    return Finding(Check.NODE, HARD, f"file is of node {file_node} / provider {file_provider}, "
                   f"submitted by node {chain_node} / provider {chain_provider}",
                   {"file_node": file_node, "chain_node": chain_node})


def check_work_units(claimed_file: int, claimed_chain: int, prompt_lens: Sequence[int],
                     completion_lens: Sequence[int]) -> Finding | None:
    """Units claimed (in the file and on chain) equal the tokens processed."""
    tokens = work_units(prompt_lens, completion_lens)
    if claimed_file == tokens and claimed_chain == tokens:
        return None
    return Finding(Check.WORK_UNITS, HARD, f"claims {claimed_chain} units on chain and "
                   f"{claimed_file} in the file for {tokens} tokens processed",
                   {"chain": claimed_chain, "file": claimed_file, "tokens": tokens})


def check_prompts(claimed: Sequence[Sequence[int]],
                  expected: Sequence[Sequence[int]]) -> Finding | None:
    """Every row holds the prompt the assignment gives that row (`Assignment.prompt_rows`:
    each assigned prompt `group_size` times)."""
    if len(claimed) != len(expected):
        return Finding(Check.PROMPTS, HARD, f"{len(claimed)} rows where the assignment has "
                       f"{len(expected)}", {"rows": len(claimed), "expected": len(expected)})
    bad = [r for r, (c, w) in enumerate(zip(claimed, expected, strict=True))
           if list(c) != list(w)]
    if not bad:
        return None
    return Finding(Check.PROMPTS, HARD, f"{len(bad)} of {len(expected)} rows hold prompts the "
                   f"node was not assigned, first row {bad[0]}", {"bad_rows": len(bad),
                                                                 "first": bad[0]})


def check_sampling_seed(seed: int, expected: int) -> Finding | None:
    """The file's sampler seed is the one its assignment derives (`Assignment.sampler_seed`)."""
    if seed == expected:
        return None
    return Finding(Check.SAMPLING_SEED, HARD, f"sampler seed {seed} is not the assigned "
                   f"{expected}", {"seed": str(seed), "expected": str(expected)})


def check_rewards(claimed: Sequence[float], recomputed: Sequence[float],
                  atol: float = 1e-6) -> Finding | None:
    """Every claimed reward equals the task verifier's re-run."""
    if len(claimed) != len(recomputed):
        return Finding(Check.REWARDS, HARD, f"{len(claimed)} rewards for {len(recomputed)} rows")
    bad = [i for i, (c, r) in enumerate(zip(claimed, recomputed, strict=True))
           if not (math.isfinite(c) and abs(c - r) <= atol)]
    if not bad:
        return None
    i = bad[0]
    return Finding(Check.REWARDS, HARD, f"{len(bad)} of {len(claimed)} rewards differ from the "
                   f"verifier, first row {i}: claims {claimed[i]}, recomputed {recomputed[i]}",
                   {"bad_rows": len(bad), "claimed_sum": float(sum(claimed)),
                    "recomputed_sum": float(sum(recomputed))})


def check_slot_claim(file_claim: dict[str, int], slot_claim: dict[str, int]) -> Finding | None:
    """The file says what its node declared in the signed upload-slot request (policy
    version, work units, counter): the orchestrator granted the slot only for a version inside the
    window, so a file of another version lied to it."""
    diffs = {k: (file_claim.get(k), v) for k, v in slot_claim.items() if file_claim.get(k) != v}
    if not diffs:
        return None
    text = ", ".join(f"{k} {a} in the file, {b} in the slot request"
                     for k, (a, b) in sorted(diffs.items()))
    return Finding(Check.SLOT_CLAIM, HARD, text, {k: f"{a}/{b}" for k, (a, b) in diffs.items()})


def check_header_rules(pool_id: int, rules_sha256: str, rules: PoolRules) -> Finding | None:
    """The header names this pool and the digest of its published rules: a file generated
    under other rules is not the work the pool asked for, whatever its rows say."""
    diffs = [k for k, got, want in (("pool_id", pool_id, rules.pool_id),
                                    ("rules_sha256", rules_sha256, rules.digest()))
             if got != want]
    if not diffs:
        return None
    return Finding(Check.RULES, HARD, "the header's " + ", ".join(diffs) + " differ from the "
                   "pool's published rules", {"pool_id": pool_id,
                                              "rules_sha256": rules_sha256[:16]})


def row_termination(token_ids: Sequence[int], finish_reason: str, limit: int,
                    eos_token_ids: Sequence[int], stop_token_ids: Sequence[int] = ()) -> str | None:
    """Why a row's finish reason does not match its tokens (None: it does). A row ends on EOS
    ("eos"), a stop token ("stop") or exactly at `limit` tokens ("length": `max_new_tokens`, or
    less where the context ends first), and holds no EOS / stop token before its last one."""
    tokens = list(token_ids)
    eos, stop = set(eos_token_ids), set(stop_token_ids)
    last = tokens[-1] if tokens else None
    if len(tokens) > limit:
        return f"{len(tokens)} tokens > limit {limit}"
    if any(t in eos | stop for t in tokens[:-1]):
        return "generation continued past an EOS / stop token"
    if finish_reason == "eos":
        return None if last in eos else "claimed EOS but the last token is not EOS"
    if finish_reason == "stop":
        return None if last in stop else "claimed a stop token but the last token is not one"
    if finish_reason == "length":
        if len(tokens) != limit:
            return f"claimed the length limit with {len(tokens)} of {limit} tokens"
        return "claimed the length limit but ended on EOS / stop" if last in eos | stop else None
    return f"unknown finish reason {finish_reason!r}"


def check_termination(rows: Sequence[tuple[Sequence[int], str, int]], eos_token_ids: Sequence[int],
                      stop_token_ids: Sequence[int] = ()) -> Finding | None:
    """Every row's finish reason matches its tokens (`row_termination`); rows are (completion
    tokens, finish reason, length limit of that row)."""
    bad = [(i, why) for i, (tokens, reason, limit) in enumerate(rows)
           if (why := row_termination(tokens, reason, limit, eos_token_ids, stop_token_ids))]
    if not bad:
        return None
    return Finding(Check.TERMINATION, HARD, f"{len(bad)} of {len(rows)} rows, first row "
                   f"{bad[0][0]}: {bad[0][1]}", {"bad_rows": len(bad), "first": bad[0][0]})
