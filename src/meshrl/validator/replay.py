"""The model-dependent checks of a rollout file, from one batched prefill of all its rows.

One `score` call on the claimed policy version gives, for every completion token, the final
hidden state and the logits at the position that predicted it. From them: the seeded sampler is
replayed for every token (`meshrl.inference.sampling`), termination is checked against the
tokens, the claimed log-probs are compared, and the TOPLOC proofs are verified with the pooled
verdict over all chunks of the file. Several files share one prefill batch (`replay_files`).

The rows judged are the file's own (`meshrl.wire.rollout_file.Completion`): an episode's model
turns are its model segments, each judged as a row of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from pydantic import Field, model_validator

from meshrl.config import Config
from meshrl.inference import InferenceBackend
from meshrl.inference.sampling import gumbel_noise, token_margins
from meshrl.pool import Check, Finding, Severity, profile
from meshrl.toploc import Thresholds, pooled_limits, verdict, verify_proofs_many
from meshrl.toploc.proofs import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK
from meshrl.validator.checks import check_termination
from meshrl.wire.rollout_file import Completion, segments

HARD = Severity.HARD

__all__ = ["EXACT_SCORE", "ReplayConfig", "ReplaySpec", "ReplayStats",
           "inexact_token_limit", "model_layers", "profile_thresholds", "replay_file",
           "replay_files"]


def profile_thresholds(name: str) -> Thresholds:
    """The TOPLOC thresholds of proof profile `name` (`meshrl.pool.PROFILES`: overrides of the
    calibrated defaults; KeyError names the known profiles)."""
    return Thresholds(**profile(name).thresholds)


class ReplayConfig(Config):
    """Tolerances of the replayed checks (floating-point noise between worker and validator).

    The per-token tolerances default to the proof profile's (`thresholds.max_sampling_margin`,
    `thresholds.max_logprob_diff`): honest noise depends on the compute the profile admits
    (docs/roles.md, "Tolerances"). Setting one here replaces the profile's (experts only).
    """

    chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1, description="TOPLOC tokens per proof")
    topk: int = Field(DEFAULT_TOPK, ge=1, description="TOPLOC activations per proof")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="TOPLOC thresholds "
                                   "and replay tolerances (the validator sets its proof "
                                   "profile's)")
    sampling_tolerance: float = Field(0.5, gt=0, description="score slack of the replay "
                                      "(default: thresholds.max_sampling_margin)")
    logprob_atol: float = Field(0.5, gt=0, description="largest log-prob difference (nats; "
                                "default: thresholds.max_logprob_diff)")
    max_batch_rows: int = Field(256, ge=1, description="rows per prefill (several files share)")
    model_layers: int | None = Field(None, description="set by the replay: the depth its "
                                     "thresholds were widened for (`Thresholds.for_depth`)")

    @model_validator(mode="before")
    @classmethod
    def _profile_tolerances(cls, data: Any) -> Any:
        """Unset tolerances come from the thresholds (the proof profile's)."""
        if not isinstance(data, dict):
            return data
        th = data.get("thresholds")
        th = th if isinstance(th, Thresholds) else Thresholds.model_validate(th or {})
        return {"sampling_tolerance": th.max_sampling_margin,
                "logprob_atol": th.max_logprob_diff,
                **{k: v for k, v in data.items() if v is not None}}


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
    # positions, in the rows replayed, of an episode's rows (`meshrl.pool.episode`): their
    # model segments are judged as rows, their termination the episode check judged
    episodes: frozenset[int] = frozenset()


@dataclass
class ReplayStats:
    """The numbers behind the verdict (the honest margin is measured from these)."""

    rows: int = 0
    tokens: int = 0
    depth_factor: float = 1.0  # the noise-driven bounds' widening for the model's depth
    chunks: int = 0
    max_sampling_margin: float = 0.0  # largest (best score in the nucleus - claimed's score)
    max_top_p_excess: float = 0.0  # largest nucleus slack a claimed token needed
    inexact_tokens: int = 0  # tokens whose margin or nucleus slack exceeds EXACT_SCORE
    inexact_limit: int = 0  # how many honest noise may give at this many tokens
    max_logprob_diff: float = 0.0
    logprob_bias: float = 0.0  # mean (claimed - recomputed) over the file's tokens
    logprob_bias_limit: float = 0.0  # what that mean may reach at this many tokens
    logprob_abs_mean: float = 0.0  # mean |claimed - recomputed|: a sign-balanced bias shows
    logprob_abs_limit: float = 0.0  # what that mean may reach at this many tokens
    max_exp_mismatches: int = 0
    max_mant_err_mean: float = 0.0
    max_mant_err_median: float = 0.0
    pooled: dict[str, float] = field(default_factory=dict)
    pooled_limits: dict[str, float] = field(default_factory=dict)  # at this many chunks


def replay_file(engine: InferenceBackend, rows: Sequence[Completion], spec: ReplaySpec,
                cfg: ReplayConfig) -> tuple[list[Finding], ReplayStats]:
    return replay_files(engine, [(rows, spec)], cfg)[0]


def replay_files(engine: InferenceBackend,
                 files: Sequence[tuple[Sequence[Completion], ReplaySpec]],
                 cfg: ReplayConfig) -> list[tuple[list[Finding], ReplayStats]]:
    """Replay several files whose rows share a policy version and temperature, batched."""
    layers = model_layers(engine)
    if cfg.model_layers is None:  # once: a recursive call gets the widened thresholds
        th = cfg.thresholds.for_depth(layers)
        update: dict[str, Any] = {"thresholds": th, "model_layers": layers or 0}
        if cfg.logprob_atol == cfg.thresholds.max_logprob_diff:  # the profile's, not an expert's
            update["logprob_atol"] = th.max_logprob_diff
        cfg = cfg.model_copy(update=update)
    temps = {spec.temperature for _, spec in files}
    if len(temps) > 1:  # one prefill computes log-probs at one temperature
        return [r for f in files for r in replay_files(engine, [f], cfg)]
    temperature = files[0][1].temperature if files else 1.0
    flat = [row for rows, _ in files for row in rows]
    scored = []
    for lo in range(0, len(flat), cfg.max_batch_rows):
        part = flat[lo : lo + cfg.max_batch_rows]
        scored += engine.score([r.prompt_tokens for r in part],
                               [r.completion_tokens for r in part],
                               temperature=temperature, return_hidden_states=True,
                               return_logits=True)
    out, at = [], 0
    for rows, spec in files:
        out.append(_judge(rows, scored[at : at + len(rows)], spec, cfg))
        at += len(rows)
    return out


def model_layers(engine: InferenceBackend) -> int | None:
    """The number of decoder layers of the model `engine` runs (the CPU engine's spec, the
    reference backend's HF config), None when unknown: the profile's noise-driven bounds widen
    with depth (`Thresholds.for_depth`, issue #40)."""
    spec = getattr(engine, "spec", None)
    config = getattr(getattr(engine, "model", None), "config", None)
    n = getattr(spec, "layers", None) or getattr(config, "num_hidden_layers", None)
    return n if isinstance(n, int) and n > 0 else None


def _model_turns(rows: Sequence[Completion], scored: Sequence[Any], episodes: frozenset[int],
                 chunk_size: int) -> tuple[list[Completion], list[Any]]:
    """Each episode (a row of `episodes`) split into its model turns, each judged as a row of
    its own: its tokens, log-probs and proofs, the prefill's numbers at its positions (taken
    from the whole conversation's one prefill), and the sampler's key of its turn; tool
    outputs are left out (the episode check re-ran them)."""
    from meshrl.inference import ScoreResult
    from meshrl.pool.episode import turn_seq_id

    out_rows, out_scored = [], []
    for i, (r, s) in enumerate(zip(rows, scored, strict=True)):
        if i not in episodes:
            out_rows.append(r)
            out_scored.append(s)
            continue
        at = 0
        for turn, seg in enumerate(x for x in segments(r) if x.model):
            start, end = seg.start, seg.end
            n = -(-(end - start) // chunk_size)
            out_rows.append(replace(
                r, completion_tokens=r.completion_tokens[start:end],
                logprobs=r.logprobs[start:end], finish_reason="stop",
                seq_id=turn_seq_id(r.seq_id, turn), toploc_proofs=r.toploc_proofs[at:at + n],
                segment_kinds=[], segment_lengths=[], segment_tools=[], segment_exits=[]))
            at += n
            out_scored.append(ScoreResult(
                s.logprobs[start:end],
                None if s.hidden_states is None else s.hidden_states[start:end],
                None if s.logits is None else s.logits[start:end]))
    return out_rows, out_scored


def _judge(rows: Sequence[Completion], scored: Sequence[Any], spec: ReplaySpec,
           cfg: ReplayConfig) -> tuple[list[Finding], ReplayStats]:
    findings: list[Finding] = []
    _termination([r for i, r in enumerate(rows) if i not in spec.episodes], spec,
                 findings)  # episodes: checked
    rows, scored = _model_turns(rows, scored, spec.episodes, cfg.chunk_size)
    stats = ReplayStats(rows=len(rows), tokens=sum(len(r.completion_tokens) for r in rows),
                        depth_factor=cfg.thresholds.depth_factor(cfg.model_layers))
    nonempty = [(i, r, s) for i, (r, s) in enumerate(zip(rows, scored, strict=True))
                if r.completion_tokens]
    if nonempty:
        _sampling(nonempty, spec, cfg, findings, stats)
        _logprobs(nonempty, cfg, findings, stats)
    _toploc(rows, scored, cfg, findings, stats)
    return findings, stats


def _termination(rows: Sequence[Completion], spec: ReplaySpec,
                 findings: list[Finding]) -> None:
    def limit(r: Completion) -> int:  # a row may end on "length" where the context ends
        if spec.max_seq_len is None:
            return spec.max_new_tokens
        return min(spec.max_new_tokens, spec.max_seq_len - len(r.prompt_tokens))

    bad = check_termination([(r.completion_tokens, r.finish_reason, limit(r)) for r in rows],
                            spec.eos_token_ids, spec.stop_token_ids)
    if bad is not None:
        findings.append(bad)


# a score difference float32 recomputation never reaches (honest float32: 0 measured,
# log-probs within 1e-6): above it a token is not exactly the sampler's pick
EXACT_SCORE = 1e-4


def inexact_token_limit(tokens: int, rate: float) -> int:
    """How many of `tokens` honest tokens may be inexact picks (near-ties that recomputation
    noise flipped, nucleus-boundary tokens) at honest rate `rate`: the mean plus three standard
    deviations of a Poisson count, plus one."""
    mean = rate * tokens
    return math.floor(mean + 3.0 * math.sqrt(mean) + 1.0)


def _mass_before(scaled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of [N, V]: the probability mass of the tokens ranked above it (as
    `top_p_mask` ranks them), and whether it is the most probable (always in the nucleus)."""
    probs = torch.softmax(scaled.float(), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = torch.empty_like(sorted_p).scatter(-1, order, sorted_p.cumsum(-1) - sorted_p)
    first = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order[:, :1], True)
    return before, first


def _sampling(rows, spec: ReplaySpec, cfg: ReplayConfig, findings: list[Finding],
              stats: ReplayStats) -> None:
    """Every token must be the seeded sampler's pick: inside the nucleus (widened by
    `top_p_slack`) and within `sampling_tolerance` of the best score among the tokens certainly
    in it (narrowed by the slack). The same test as `inference.sampling.check_sampled_tokens`,
    keeping the per-token numbers the honest margin is measured by."""
    logits = torch.cat([s.logits for _, _, s in rows])
    tokens = torch.tensor([t for _, r, _ in rows for t in r.completion_tokens])
    seq = [r.seq_id for _, r, _ in rows for _ in r.completion_tokens]
    pos = [j for _, r, _ in rows for j in range(len(r.completion_tokens))]
    tol, slack = cfg.sampling_tolerance, cfg.thresholds.top_p_slack
    if spec.top_p >= 1.0 or spec.temperature == 0:
        margins = token_margins(logits, tokens, spec.seed, seq, pos, spec.temperature)
        in_nucleus = torch.ones_like(margins, dtype=torch.bool)
    else:
        scaled = logits.double() / spec.temperature
        scores = scaled + gumbel_noise(spec.seed, seq, pos, logits.shape[-1], logits.device)
        before, first = _mass_before(scaled)
        claimed_before = before.gather(-1, tokens[:, None])[:, 0].double()
        claimed_first = first.gather(-1, tokens[:, None])[:, 0]
        excess = (claimed_before - spec.top_p).clamp(min=0).masked_fill(claimed_first, 0.0)
        in_nucleus = excess < slack if slack > 0 else excess <= 0
        strict = (before < max(1e-6, spec.top_p - slack)) | first
        claimed_score = scores.gather(-1, tokens[:, None])
        best = scores.masked_fill(~strict, float("-inf")).max(dim=-1).values
        margins = best - claimed_score[:, 0]
        # the slack this token needs: the claimed token inside the widened nucleus, and every
        # token that beats it by more than the tolerance outside the narrowed one
        beats = (scores > claimed_score + tol) & ~first
        shortfall = (spec.top_p - before.double()).masked_fill(~beats, 0.0).amax(dim=-1)
        needed = torch.maximum(excess, shortfall.clamp(min=0))
        stats.max_top_p_excess = float(needed.max())
    ok = in_nucleus & (margins <= tol)
    stats.max_sampling_margin = float(margins.max())
    inexact = margins > EXACT_SCORE
    if spec.top_p < 1.0 and spec.temperature > 0:
        inexact |= needed > EXACT_SCORE
    stats.inexact_tokens = int(inexact.sum())
    stats.inexact_limit = inexact_token_limit(len(ok), cfg.thresholds.max_inexact_token_rate)
    if bool(ok.all()):
        if stats.inexact_tokens > stats.inexact_limit:
            findings.append(Finding(
                Check.SAMPLING, HARD, f"{stats.inexact_tokens} of {len(ok)} replayed tokens "
                f"are not exactly the seeded sampler's pick (each within the tolerance), more "
                f"than honest noise gives on that many ({stats.inexact_limit}): chosen "
                f"near-ties or another top_p",
                {"inexact_tokens": stats.inexact_tokens, "limit": stats.inexact_limit,
                 "tokens": len(ok)}))
        return
    owner = [i for i, r, _ in rows for _ in r.completion_tokens]
    first_bad = int((~ok).nonzero()[0, 0])
    where = f"first in row {owner[first_bad]} at position {pos[first_bad]}"
    why = (f"score margin {float(margins[first_bad]):.3g} > tolerance {tol}"
           if bool(in_nucleus[first_bad]) else
           f"outside the top_p {spec.top_p} nucleus by more than the slack {slack}")
    findings.append(Finding(
        Check.SAMPLING, HARD, f"{int((~ok).sum())} of {len(ok)} tokens are not the seeded "
        f"sampler's pick, {where} ({why})",
        {"bad_tokens": int((~ok).sum()), "outside_nucleus": int((~in_nucleus).sum()),
         "tokens": len(ok), "max_margin": stats.max_sampling_margin,
         "max_top_p_excess": stats.max_top_p_excess}))


def _logprobs(rows, cfg: ReplayConfig, findings: list[Finding], stats: ReplayStats) -> None:
    """Claimed log-probs are the trainer's behaviour log-probs (its importance ratio's
    denominator), so each token's error, their mean and their mean size over the file are
    bounded: honest errors are small and of either sign, a bias moves every ratio of the file
    one way, and a sign-balanced one (+d here, -d there) moves each ratio with a zero mean."""
    claimed = torch.tensor([x for _, r, _ in rows for x in r.logprobs], dtype=torch.float32)
    own = torch.cat([s.logprobs for _, _, s in rows])
    if claimed.shape != own.shape:
        findings.append(Finding(Check.LOGPROBS, HARD, f"{claimed.numel()} log-probs for "
                                f"{own.numel()} tokens"))
        return
    signed = (claimed.double() - own.double()).nan_to_num(nan=float("inf"))
    diff = signed.abs()
    stats.max_logprob_diff = float(diff.max())
    stats.logprob_bias = float(signed.mean())
    stats.logprob_bias_limit = (cfg.thresholds.max_logprob_bias
                                + cfg.thresholds.logprob_bias_noise / math.sqrt(signed.numel()))
    stats.logprob_abs_mean = float(diff.mean())
    stats.logprob_abs_limit = (cfg.thresholds.max_logprob_abs_mean
                               + cfg.thresholds.logprob_bias_noise / math.sqrt(signed.numel()))
    if stats.max_logprob_diff > cfg.logprob_atol:
        findings.append(Finding(Check.LOGPROBS, HARD, f"claimed log-probs differ by up to "
                                f"{stats.max_logprob_diff:.4g} > {cfg.logprob_atol}",
                                {"max_diff": stats.max_logprob_diff,
                                 "bad_tokens": int((diff > cfg.logprob_atol).sum())}))
    elif not abs(stats.logprob_bias) <= stats.logprob_bias_limit:
        findings.append(Finding(Check.LOGPROBS, HARD, f"claimed log-probs are biased: mean "
                                f"difference {stats.logprob_bias:.3g} over {signed.numel()} "
                                f"tokens > {stats.logprob_bias_limit:.3g}",
                                {"bias": stats.logprob_bias,
                                 "limit": stats.logprob_bias_limit}))
    elif not stats.logprob_abs_mean <= stats.logprob_abs_limit:
        # +d on some tokens and -d on others: a zero mean, every such ratio moved (issue #41)
        findings.append(Finding(Check.LOGPROBS, HARD, f"claimed log-probs deviate: mean "
                                f"|difference| {stats.logprob_abs_mean:.3g} over "
                                f"{signed.numel()} tokens > {stats.logprob_abs_limit:.3g}",
                                {"abs_mean": stats.logprob_abs_mean,
                                 "limit": stats.logprob_abs_limit}))


def _toploc(rows, scored, cfg: ReplayConfig, findings: list[Finding],
            stats: ReplayStats) -> None:
    checked = [(s.hidden_states, list(r.toploc_proofs)) for r, s in zip(rows, scored, strict=True)
               if r.completion_tokens]
    chunks = [c for per_row in verify_proofs_many(checked, cfg.chunk_size, cfg.topk)
              for c in per_row]  # every replayed row's chunks evaluated together
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
        limits = pooled_limits(cfg.thresholds, v.stats.chunks)
        stats.pooled_limits = {k: limits[f"max_pooled_{k}"] for k in stats.pooled
                               if limits[f"max_pooled_{k}"] is not None}
    if not v.accepted:
        findings.append(Finding(Check.TOPLOC, HARD, f"{len(v.reasons)} failed test(s) over "
                                f"{len(chunks)} chunks, first: {v.reasons[0]}",
                                {"chunks": len(chunks), "max_exp_mismatches":
                                 stats.max_exp_mismatches, "max_mant_err_mean":
                                 stats.max_mant_err_mean, **stats.pooled}))
