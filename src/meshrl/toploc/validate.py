"""One validator decision for a rollout: TOPLOC proofs + sampling + termination + log-probs.

Model-agnostic: the caller recomputes each completion with one prefill of prompt + completion on
the claimed policy version (`InferenceBackend.score` with hidden states and logits, or
`meshrl.toploc.recompute.recompute_mode`) and passes the `ScoreResult`s in. The TOPLOC verdict
is taken over all chunks of all completions together, so the pooled statistics see the whole
rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

from meshrl.config import Config
from meshrl.inference import Completion, SamplingParams, ScoreResult
from meshrl.toploc.checks import (
    check_logprobs,
    check_sampling,
    check_termination,
)
from meshrl.toploc.proofs import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK, ChunkResult, verify_proofs
from meshrl.toploc.thresholds import Thresholds, Verdict, verdict

__all__ = ["Claim", "RolloutReport", "ValidatorConfig", "validate_rollout"]


class ValidatorConfig(Config):
    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, description="decoded tokens per proof")
    topk: int = Field(DEFAULT_TOPK, description="activations committed per chunk")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    sampling_tolerance: float = Field(0.05, description="score slack of the sampling replay")
    logprob_atol: float = Field(0.05, description="largest accepted log-prob difference (nats)")


@dataclass
class Claim(Completion):
    """What a worker submitted for one completion: the `Completion` (its hidden states stay with
    the worker) and the TOPLOC proofs of those hidden states."""

    proofs: list[bytes] | list[str] = field(default_factory=list)

    @classmethod
    def of(cls, completion: Completion, proofs: list[bytes] | list[str]) -> Claim:
        fields = {k: v for k, v in vars(completion).items() if k not in ("hidden_states", "proofs")}
        return cls(**fields, proofs=proofs)


@dataclass
class RolloutReport:
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    toploc: Verdict | None = None
    chunk_results: list[ChunkResult] = field(default_factory=list)


def validate_rollout(
    claims: Sequence[Claim],
    recomputed: Sequence[ScoreResult],
    params: SamplingParams,
    eos_token_id: int | None,
    cfg: ValidatorConfig | None = None,
) -> RolloutReport:
    """Accept only if every completion passes every check and the pooled TOPLOC verdict holds.

    `params` are the sampling parameters the rollout was generated with (public, part of the
    task) and `eos_token_id` the policy's EOS. recomputed[i] scores claims[i] with hidden states
    [n_i, H] and logits [n_i, V], position j predicting token j of the completion.
    """
    cfg = cfg or ValidatorConfig()
    reasons: list[str] = []
    chunks: list[ChunkResult] = []
    if len(claims) != len(recomputed):
        reasons.append(f"{len(claims)} claims but {len(recomputed)} recomputations")
    eos = () if eos_token_id is None or params.ignore_eos else (eos_token_id,)
    for i, (claim, rec) in enumerate(zip(claims, recomputed, strict=False)):
        hidden, logits, n = rec.hidden_states, rec.logits, len(claim.token_ids)
        if hidden is None or logits is None:
            reasons.append(f"completion {i}: recomputation without hidden states and logits")
            continue
        if hidden.shape[0] != n or logits.shape[0] != n:
            reasons.append(f"completion {i}: recomputation covers {hidden.shape[0]} of {n} tokens")
            continue
        checks = [
            check_termination(claim.token_ids, claim.finish_reason, params.max_new_tokens,
                              eos, params.stop_token_ids),
            check_sampling(logits, claim.token_ids, params.seed, claim.seq_id,
                           params.temperature, params.top_p, cfg.sampling_tolerance),
            check_logprobs(claim.logprobs, logits, claim.token_ids, params.temperature,
                           cfg.logprob_atol),
        ]
        reasons += [f"completion {i}: {c.reason}" for c in checks if not c.ok]
        chunks += verify_proofs(hidden, list(claim.proofs), cfg.chunk_size, cfg.topk)
    toploc = verdict(chunks, cfg.thresholds)  # chunk numbers count over the whole rollout
    reasons += [f"toploc: {r}" for r in toploc.reasons]
    return RolloutReport(not reasons, reasons, toploc, chunks)
