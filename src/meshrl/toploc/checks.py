"""Checks beside the activation proof: sampling, termination, log-probs, rewards.

Each returns a `CheckResult` (never raises on bad claims) so a validator can collect reasons.
Sampling replays `meshrl.inference.sampling` exactly: the claimed token must be what the seeded
Gumbel-max sampler picks from the validator's recomputed logits, up to a float tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from meshrl.inference.sampling import check_sampled_tokens

__all__ = [
    "CheckResult",
    "check_logprobs",
    "check_rewards",
    "check_sampling",
    "check_termination",
    "recompute_logprobs",
]


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reason: str | None = None

    @classmethod
    def fail(cls, reason: str) -> CheckResult:
        return cls(False, reason)


def check_sampling(
    logits: torch.Tensor,
    token_ids: Sequence[int] | torch.Tensor,
    seed: int,
    seq_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    tolerance: float = 0.05,
) -> CheckResult:
    """Were `token_ids` what the seeded sampler picks? logits[j] predicts token j."""
    tokens = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    if logits.dim() != 2 or logits.shape[0] != tokens.shape[0]:
        return CheckResult.fail(
            f"sampling: {tokens.shape[0]} tokens for logits of shape {tuple(logits.shape)}"
        )
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= logits.shape[1]):
        return CheckResult.fail("sampling: token id outside the vocabulary")
    if not torch.isfinite(logits).all():
        return CheckResult.fail("sampling: recomputed logits are not finite")
    n = tokens.shape[0]
    ok = check_sampled_tokens(
        logits, tokens, seed, [seq_id] * n, list(range(n)), temperature, top_p, tolerance
    )
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten().tolist()
        return CheckResult.fail(f"sampling: {len(bad)} token(s) not picked by the seeded "
                                f"sampler, first at position {bad[0]}")
    return CheckResult(True)


def check_termination(
    token_ids: Sequence[int],
    finish_reason: str,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    stop_token_ids: Sequence[int] = (),
) -> CheckResult:
    """A completion ends on EOS ("eos"), a stop token ("stop") or exactly at the limit ("length"),
    and contains no EOS / stop token before its last position."""
    tokens = list(token_ids)
    ends = set(eos_token_ids) | set(stop_token_ids)
    if len(tokens) > max_new_tokens:
        return CheckResult.fail(f"termination: {len(tokens)} tokens > limit {max_new_tokens}")
    if any(t in ends for t in tokens[:-1]):
        return CheckResult.fail("termination: generation continued past an EOS / stop token")
    last = tokens[-1] if tokens else None
    if finish_reason == "eos":
        if last not in set(eos_token_ids):
            return CheckResult.fail("termination: claimed EOS but the last token is not EOS")
    elif finish_reason == "stop":
        if last not in set(stop_token_ids):
            return CheckResult.fail("termination: claimed a stop token but the last token is not")
    elif finish_reason == "length":
        if len(tokens) != max_new_tokens:
            return CheckResult.fail(
                f"termination: claimed length limit with {len(tokens)} of {max_new_tokens} tokens"
            )
        if last in ends:
            return CheckResult.fail("termination: claimed length limit but ended on EOS / stop")
    else:
        return CheckResult.fail(f"termination: unknown finish reason {finish_reason!r}")
    return CheckResult(True)


def recompute_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int] | torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / T)[token] per row (float32); T = 0 is scored at T = 1."""
    tokens = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1, 1)
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1).gather(-1, tokens).squeeze(-1)


def check_logprobs(
    claimed: Sequence[float] | torch.Tensor,
    logits: torch.Tensor,
    token_ids: Sequence[int] | torch.Tensor,
    temperature: float = 1.0,
    atol: float = 0.05,
) -> CheckResult:
    """Claimed per-token log-probs agree with the recomputation to `atol` (nats)."""
    claimed_t = torch.as_tensor(claimed, dtype=torch.float32).reshape(-1)
    tokens = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    if claimed_t.shape[0] != tokens.shape[0] or logits.shape[0] != tokens.shape[0]:
        return CheckResult.fail(f"logprobs: {claimed_t.shape[0]} claimed for {tokens.shape[0]} "
                                f"tokens and {logits.shape[0]} rows of logits")
    if not torch.isfinite(claimed_t).all():
        return CheckResult.fail("logprobs: claimed log-probs are not finite")
    diff = (claimed_t - recompute_logprobs(logits, tokens, temperature)).abs()
    if not bool((diff <= atol).all()):
        j = int(diff.argmax())
        return CheckResult.fail(f"logprobs: token {j} differs by {float(diff[j]):.4g} > {atol}")
    return CheckResult(True)


def check_rewards(
    claimed: Sequence[float], recomputed: Sequence[float], atol: float = 1e-6
) -> CheckResult:
    """Claimed rewards equal the validator's re-run of the task verifier."""
    if len(claimed) != len(recomputed):
        return CheckResult.fail(f"rewards: {len(claimed)} claimed, {len(recomputed)} recomputed")
    for i, (c, r) in enumerate(zip(claimed, recomputed, strict=True)):
        if not (math.isfinite(c) and abs(c - r) <= atol):
            return CheckResult.fail(f"rewards: completion {i} claims {c}, recomputed {r}")
    return CheckResult(True)
