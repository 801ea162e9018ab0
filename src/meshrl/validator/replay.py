"""The model-dependent checks of a rollout file, from one batched prefill of all its rows.

One `score` call on the claimed policy version gives, for every completion token, the final
hidden state and the logits at the position that predicted it. From them: the seeded sampler is
replayed for every token (`meshrl.inference.sampling`), termination is checked against the
tokens, the claimed log-probs are compared, and the TOPLOC proofs are verified with the pooled
verdict over all chunks of the file. Several files share one prefill batch (`replay_files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field

from meshrl.config import Config
from meshrl.inference import InferenceBackend
from meshrl.inference.sampling import check_sampled_tokens, token_margins
from meshrl.pool import Check, Finding, Severity, profile
from meshrl.toploc import Thresholds, verdict, verify_proofs
from meshrl.toploc.proofs import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK
from meshrl.validator.checks import check_termination

HARD = Severity.HARD

__all__ = ["ReplayConfig", "ReplayRow", "ReplaySpec", "ReplayStats", "profile_thresholds",
           "replay_file", "replay_files"]


def profile_thresholds(name: str) -> Thresholds:
    """The TOPLOC thresholds of proof profile `name` (`meshrl.pool.PROFILES`: overrides of the
    calibrated defaults; KeyError names the known profiles)."""
    return Thresholds(**profile(name).thresholds)


class ReplayConfig(Config):
    """Tolerances of the replayed checks (floating-point noise between worker and validator)."""

    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1, description="TOPLOC tokens per proof")
    topk: int = Field(DEFAULT_TOPK, ge=1, description="TOPLOC activations per proof")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="TOPLOC thresholds "
                                   "(the validator sets its proof profile's)")
    sampling_tolerance: float = Field(0.05, gt=0, description="score slack of the replay")
    logprob_atol: float = Field(0.05, gt=0, description="largest log-prob difference (nats)")
    max_batch_rows: int = Field(256, ge=1, description="rows per prefill (several files share)")


@dataclass(frozen=True)
class ReplaySpec:
    """How the file's rows had to be sampled (from the work order and the public seed rule)."""

    seed: int
    max_new_tokens: int
    temperature: float
    top_p: float
    eos_token_ids: tuple[int, ...]
    stop_token_ids: tuple[int, ...] = ()
    max_seq_len: int | None = None  # context limit: a row may end on "length" earlier


@dataclass
class ReplayRow:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    seq_id: int
    proofs: list[bytes]


@dataclass
class ReplayStats:
    """The numbers behind the verdict (the honest margin is measured from these)."""

    rows: int = 0
    tokens: int = 0
    chunks: int = 0
    max_sampling_margin: float = 0.0  # largest (best score - claimed token's score)
    max_logprob_diff: float = 0.0
    max_exp_mismatches: int = 0
    max_mant_err_mean: float = 0.0
    max_mant_err_median: float = 0.0
    pooled: dict[str, float] = field(default_factory=dict)


def replay_file(engine: InferenceBackend, rows: Sequence[ReplayRow], spec: ReplaySpec,
                cfg: ReplayConfig) -> tuple[list[Finding], ReplayStats]:
    return replay_files(engine, [(rows, spec)], cfg)[0]


def replay_files(engine: InferenceBackend, files: Sequence[tuple[Sequence[ReplayRow], ReplaySpec]],
                 cfg: ReplayConfig) -> list[tuple[list[Finding], ReplayStats]]:
    """Replay several files whose rows share a policy version and temperature, batched."""
    temps = {spec.temperature for _, spec in files}
    if len(temps) > 1:  # one prefill computes log-probs at one temperature
        return [r for f in files for r in replay_files(engine, [f], cfg)]
    temperature = files[0][1].temperature if files else 1.0
    flat = [row for rows, _ in files for row in rows]
    scored = []
    for lo in range(0, len(flat), cfg.max_batch_rows):
        part = flat[lo : lo + cfg.max_batch_rows]
        scored += engine.score([r.prompt_ids for r in part], [r.token_ids for r in part],
                               temperature=temperature, return_hidden_states=True,
                               return_logits=True)
    out, at = [], 0
    for rows, spec in files:
        out.append(_judge(rows, scored[at : at + len(rows)], spec, cfg))
        at += len(rows)
    return out


def _judge(rows: Sequence[ReplayRow], scored: Sequence[Any], spec: ReplaySpec,
           cfg: ReplayConfig) -> tuple[list[Finding], ReplayStats]:
    findings: list[Finding] = []
    stats = ReplayStats(rows=len(rows), tokens=sum(len(r.token_ids) for r in rows))
    _termination(rows, spec, findings)
    nonempty = [(i, r, s) for i, (r, s) in enumerate(zip(rows, scored, strict=True))
                if r.token_ids]
    if nonempty:
        _sampling(nonempty, spec, cfg, findings, stats)
        _logprobs(nonempty, cfg, findings, stats)
    _toploc(rows, scored, cfg, findings, stats)
    return findings, stats


def _termination(rows: Sequence[ReplayRow], spec: ReplaySpec, findings: list[Finding]) -> None:
    def limit(r: ReplayRow) -> int:  # a row may end on "length" where the context ends
        if spec.max_seq_len is None:
            return spec.max_new_tokens
        return min(spec.max_new_tokens, spec.max_seq_len - len(r.prompt_ids))

    bad = check_termination([(r.token_ids, r.finish_reason, limit(r)) for r in rows],
                            spec.eos_token_ids, spec.stop_token_ids)
    if bad is not None:
        findings.append(bad)


def _sampling(rows, spec: ReplaySpec, cfg: ReplayConfig, findings: list[Finding],
              stats: ReplayStats) -> None:
    logits = torch.cat([s.logits for _, _, s in rows])
    tokens = torch.tensor([t for _, r, _ in rows for t in r.token_ids])
    seq = [r.seq_id for _, r, _ in rows for _ in r.token_ids]
    pos = [j for _, r, _ in rows for j in range(len(r.token_ids))]
    margins = token_margins(logits, tokens, spec.seed, seq, pos, spec.temperature)
    if spec.top_p < 1.0:  # the nucleus needs the full check
        ok = check_sampled_tokens(logits, tokens, spec.seed, seq, pos, spec.temperature,
                                  spec.top_p, cfg.sampling_tolerance)
    else:  # without a nucleus the check is exactly margin <= tolerance: one noise computation
        ok = margins <= cfg.sampling_tolerance
    stats.max_sampling_margin = float(margins.max())
    if bool(ok.all()):
        return
    owner = [i for i, r, _ in rows for _ in r.token_ids]
    first = int((~ok).nonzero()[0, 0])
    findings.append(Finding(
        Check.SAMPLING, HARD, f"{int((~ok).sum())} of {len(ok)} tokens are not the seeded "
        f"sampler's pick, first in row {owner[first]} at position {pos[first]} (score margin "
        f"{float(margins[first]):.3g} > tolerance {cfg.sampling_tolerance})",
        {"bad_tokens": int((~ok).sum()), "tokens": len(ok),
         "max_margin": stats.max_sampling_margin}))


def _logprobs(rows, cfg: ReplayConfig, findings: list[Finding], stats: ReplayStats) -> None:
    claimed = torch.tensor([x for _, r, _ in rows for x in r.logprobs], dtype=torch.float32)
    own = torch.cat([s.logprobs for _, _, s in rows])
    if claimed.shape != own.shape:
        findings.append(Finding(Check.LOGPROBS, HARD, f"{claimed.numel()} log-probs for "
                                f"{own.numel()} tokens"))
        return
    diff = (claimed - own).abs().nan_to_num(nan=float("inf"))
    stats.max_logprob_diff = float(diff.max())
    if stats.max_logprob_diff > cfg.logprob_atol:
        findings.append(Finding(Check.LOGPROBS, HARD, f"claimed log-probs differ by up to "
                                f"{stats.max_logprob_diff:.4g} > {cfg.logprob_atol}",
                                {"max_diff": stats.max_logprob_diff}))


def _toploc(rows, scored, cfg: ReplayConfig, findings: list[Finding],
            stats: ReplayStats) -> None:
    chunks = []
    for r, s in zip(rows, scored, strict=True):
        if not r.token_ids:
            continue
        chunks += verify_proofs(s.hidden_states, list(r.proofs), cfg.chunk_size, cfg.topk)
    good = [c for c in chunks if c.reason is None]
    stats.chunks = len(chunks)
    if good:
        stats.max_exp_mismatches = max(c.exp_mismatches for c in good)
        stats.max_mant_err_mean = max(c.mant_err_mean for c in good)
        stats.max_mant_err_median = max(c.mant_err_median for c in good)
    v = verdict(chunks, cfg.thresholds)
    if v.stats is not None:
        stats.pooled = {"exp_mismatch_rate": v.stats.exp_mismatch_rate,
                        "mant_err_mean": v.stats.mant_err_mean,
                        "mant_inexact_rate": v.stats.mant_inexact_rate}
    if not v.accepted:
        findings.append(Finding(Check.TOPLOC, HARD, f"{len(v.reasons)} failed test(s) over "
                                f"{len(chunks)} chunks, first: {v.reasons[0]}",
                                {"chunks": len(chunks), "max_exp_mismatches":
                                 stats.max_exp_mismatches, "max_mant_err_mean":
                                 stats.max_mant_err_mean, **stats.pooled}))
