# over 400 lines: every profile's thresholds beside the one decision that uses them, so a bound and
#  its use cannot drift
"""Accept or reject a rollout from its ChunkResults, with fixed or calibrated thresholds.

The TOPLOC paper's thresholds (<= 38 exponent mismatches of 128, mantissa error mean <= 10,
median <= 8) are deliberately loose so that they hold on any GPU and any kernel. On a known
model and known hardware the honest noise is far smaller, so `calibrate_thresholds` derives
thresholds from measured honest ChunkResults for a chosen false-positive rate, and the verdict
also tests statistics pooled over all chunks of a rollout: a subtle change (int8 weights, one
layer scaled by 1.1) moves every chunk a little, which pooling over many chunks exposes even
when no single chunk crosses its own threshold.

Threshold fitting (`tail_threshold`) is peaks-over-threshold with an exponential tail: below the
empirical resolution (rate < 10 / n) the quantile is extrapolated as q90 + beta * ln(0.1 / rate)
with beta the mean excess over the 90th percentile, and never set below the honest maximum;
`calibrate_thresholds` then widens each threshold's distance from the honest median by a margin
and keeps it at least 1 / HEADROOM (1 / 0.7) times the largest honest value, so honest work from
any engine, batch size, thread count or attention kernel stays well clear of rejection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

from meshrl.config import Config
from meshrl.toploc.proofs import DEFAULT_TOPK, ChunkResult

__all__ = [
    "HEADROOM",
    "ProofVerdict",
    "RolloutStats",
    "Thresholds",
    "calibrate_thresholds",
    "is_small",
    "pooled_limits",
    "rollout_stats",
    "tail_threshold",
    "threshold_ratios",
    "verdict",
]

# per-chunk statistics and pooled (rollout) statistics, each with a `max_...` threshold below
CHUNK_STATS = ("exp_mismatches", "mant_err_mean", "mant_err_median", "sign_mismatches")
POOLED_STATS = ("exp_mismatch_rate", "mant_err_mean", "mant_inexact_rate")
# statistics of a small chunk (fewer than small_chunk_ratio x topk values), each `max_small_...`
SMALL_STATS = ("exp_mismatch_rate", "mant_err_mean", "mant_err_median", "sign_mismatches")
HEADROOM = 0.7  # calibrated thresholds keep every honest statistic at most this share of them


class Thresholds(Config):
    """Largest accepted values; None disables a pooled test.

    The defaults are calibrated (`meshrl toploc calibrate`; docs/toploc.md, numbers in
    benchmarks/README.md): `calibrate_thresholds` over 10,240 honest chunks of the calibration
    model from five worker setups (meshrl's decoder and `transformers` generate at batch 1-64,
    1-2 threads, sdpa / eager) checked by eight validator setups (batch 1-64, left / right
    padding, 1-2 threads, sdpa / eager, bf16 / fp32), rounded up to two digits. Every honest
    statistic stays at most 70% of its threshold, and int8 weights, one layer's MLP scaled by
    1.1 and 1% weight noise are rejected in every rollout of 16 chunks, by the pooled tests (the
    per-chunk fits reach the paper's caps for mismatches and median, and give 3.0 for the
    mean). Shorter rollouts are pooled too, against thresholds widened by
    sqrt(pooled_full_chunks / n) (`pooled_limits`). `paper()` keeps the paper's per-chunk
    thresholds and no pooled tests: loose enough for any GPU and kernel, blind to those changes.

    Issue #26: small last chunks (fewer than small_chunk_ratio x topk values) are judged by the
    `max_small_*` tests (the paper's caps: their honest fits reach them) and left out of the
    pooled statistics; the pooled inexact rate is 0.75 (was 0.68), so honest bfloat16 and
    float16 work checked in float32 stays within 70% of every threshold on every engine
    (benchmarks/bench_calibration.py: 11,520 chunks, largest share 0.68).

    The replay tolerances (sampling margin, top_p slack, inexact-token rate, log-prob difference
    and bias) are the "any-hardware" profile's: the largest honest bfloat16 value measured by
    benchmarks/bench_honest_margin.py times 2.4-10 (docs/roles.md, "Tolerances").

    Issue #40: all of the above hold for models of up to `depth_ref_layers` (4) layers, the
    depth they were calibrated on. Low-precision rounding accumulates over the layers, so a
    validator judges a deeper model by `for_depth(layers)`: the noise-driven bounds x
    layers / 4 (x7.5 for SmolLM2-135M's 30 layers, whose honest GPU bfloat16 files
    the tiny bounds slashed; numbers in benchmarks/README.md).
    """

    max_exp_mismatches: float = Field(38, description="per chunk: exponent mismatches")
    max_mant_err_mean: float = Field(3.0, description="per chunk: mean |mantissa difference|")
    max_mant_err_median: float = Field(8.0, description="per chunk: median |mantissa difference|")
    max_sign_mismatches: int = Field(
        4, description="per chunk: sign flips among exponent-matched entries"
    )
    max_pooled_exp_mismatch_rate: float | None = Field(
        0.048, description="rollout: mismatches / compared entries over all chunks"
    )
    max_pooled_mant_err_mean: float | None = Field(
        0.78, description="rollout: mean |mantissa difference| over all matched entries"
    )
    max_pooled_mant_inexact_rate: float | None = Field(
        0.75, description="rollout: fraction of matched entries whose mantissa differs"
    )
    min_pooled_chunks: int = Field(
        1, ge=1, description="pooled tests apply to rollouts with at least this many chunks"
    )
    pooled_full_chunks: int = Field(
        16, ge=1, description="pooled thresholds hold as given from this many chunks; a "
        "rollout of n fewer gets each widened by sqrt(pooled_full_chunks / n)"
    )
    topk: int = Field(DEFAULT_TOPK, description="entries committed per chunk")
    # Small chunks: a short last chunk (1 token at hidden size 128 is 128 values) commits to a
    # large share of its values, near-zero ones included, whose bf16 / fp16 rounding noise is
    # large relative to them. Such a chunk is judged only by the small-chunk tests below,
    # calibrated on small chunks, and left out of the pooled statistics.
    small_chunk_ratio: float = Field(
        8.0, ge=0, description="a chunk of fewer than this x topk values is small (0: none)")
    max_small_exp_mismatch_rate: float = Field(
        0.3, ge=0, description="small chunk: exponent mismatches / committed entries")
    max_small_mant_err_mean: float = Field(
        10.0, ge=0, description="small chunk: mean |mantissa difference|")
    max_small_mant_err_median: float = Field(
        8.0, ge=0, description="small chunk: median |mantissa difference|")
    max_small_sign_mismatches: int = Field(
        4, ge=0, description="small chunk: sign flips among exponent-matched entries")
    # Replay tolerances beside the proof: the validator's replay (`meshrl.validator.replay`)
    # applies them. They live here so that a proof profile names every limit of honest noise.
    max_sampling_margin: float = Field(
        0.5, gt=0, description="per token: best sampler score - claimed token's score"
    )
    top_p_slack: float = Field(
        0.04, ge=0, description="nucleus mass by which a claimed token may lie outside top_p"
    )
    max_inexact_token_rate: float = Field(
        0.005, ge=0, description="file: share of tokens that may be inexact sampler picks "
        "(each within the tolerances; a Poisson allowance is added, "
        "`meshrl.validator.replay.inexact_token_limit`)"
    )
    max_logprob_diff: float = Field(
        0.5, gt=0, description="per token: |claimed - recomputed log-prob| (nats)"
    )
    max_logprob_bias: float = Field(
        0.002, ge=0, description="file: |mean(claimed - recomputed)| may reach this + "
        "logprob_bias_noise / sqrt(tokens)"
    )
    # apart from max_logprob_diff: the per-token bound must cover bf16's rare worst token on a
    # trained policy (0.28 nats), the mean only its typical noise, which averages out
    logprob_bias_noise: float = Field(
        0.2, ge=0, description="file: the per-sqrt(token) term of the log-prob bias limit"
    )
    # a sign-balanced bias (+0.45 on half the tokens, -0.45 on the rest: ratios x1.57 / x0.64)
    # has a zero mean; its mean size does not. Honest noise's mean size is far below its worst
    # token (bf16: 0.28 nats at worst on a trained policy, docs/roles.md, "Tolerances")
    max_logprob_abs_mean: float = Field(
        0.05, ge=0, description="file: mean |claimed - recomputed| may reach this + "
        "logprob_bias_noise / sqrt(tokens)"
    )

    # Issue #40: low-precision rounding errors accumulate in the residual stream layer after
    # layer, so honest bf16 / fp16 noise grows with the model's depth. The bounds above were
    # calibrated on 2-4 layer models; a deeper model's validator widens every noise-driven
    # bound by (layers / depth_ref_layers) ** depth_exponent (`for_depth`). SmolLM2-135M (30
    # layers) gets x7.5 (benchmarks/README.md): honest GPU bf16 files reached a pooled
    # mantissa error mean of 2.2 and 32 inexact tokens of 1,021, CPU bf16 1.4 and up to 4% of
    # a file's tokens; the inexact-token cap needs about x7 to keep them within 70% of it. The
    # growth is fitted to two depths (the tiny models' 2-4 layers and SmolLM2's 30): linear in
    # depth covers both; another depth is interpolated, not measured.
    depth_ref_layers: int = Field(
        4, ge=1, description="the depth the bounds above hold for; deeper models widen them")
    depth_exponent: float = Field(
        1.0, ge=0, description="noise-driven bounds x (layers / depth_ref_layers) ** this "
        "(0: independent of depth)")

    def depth_factor(self, layers: int | None) -> float:
        """How much a model of `layers` decoder layers widens the noise-driven bounds (1.0 at
        or below depth_ref_layers, or when the depth is unknown)."""
        if not layers or layers <= self.depth_ref_layers or self.depth_exponent == 0:
            return 1.0
        return float((layers / self.depth_ref_layers) ** self.depth_exponent)

    def for_depth(self, layers: int | None) -> Thresholds:
        """These thresholds for a model of `layers` decoder layers: the mantissa error means
        (per chunk capped at the paper's 10), the pooled inexact-mantissa rate (no test once
        it reaches 1) times `depth_factor(layers)`, the inexact-token rate times its 1.1th
        power, the log-prob bounds times its square root. The exponent tests, the sampling
        margin and the top_p slack stay: honest deep-model noise stays within them
        (benchmarks/README.md)."""
        f = self.depth_factor(layers)
        if f == 1.0:
            return self
        scaled: dict[str, float | None] = {
            "max_mant_err_mean": min(max(self.max_mant_err_mean, 10.0),
                                     self.max_mant_err_mean * f),
            "max_small_mant_err_mean": min(max(self.max_small_mant_err_mean, 10.0),
                                           self.max_small_mant_err_mean * f),
            # f ** 1.1 (x9.2 on SmolLM2): honest flips cluster in rows of flat distributions, so
            # their count is overdispersed; at x7.5 one honest bf16 file (22 inexact tokens of
            # 476) reached 0.71 of its cap
            "max_inexact_token_rate": self.max_inexact_token_rate * f ** 1.1,
            # the log-prob bounds: honest bf16 on SmolLM2 reached 0.72 of the per-token one
            # (0.36 nats) and 0.74-0.83 of the file's mean size, so sqrt(f) (x2.7) suffices and
            # keeps what a shift may hide smaller (mean size 0.14 + 0.55 / sqrt(n), not 0.38 +
            # 1.5 / sqrt(n))
            "max_logprob_diff": self.max_logprob_diff * f ** 0.5,
            "max_logprob_bias": self.max_logprob_bias * f ** 0.5,
            "max_logprob_abs_mean": self.max_logprob_abs_mean * f ** 0.5,
            "logprob_bias_noise": self.logprob_bias_noise * f ** 0.5,
        }
        if self.max_pooled_mant_err_mean is not None:
            scaled["max_pooled_mant_err_mean"] = self.max_pooled_mant_err_mean * f
        if self.max_pooled_mant_inexact_rate is not None:  # a rate bound of 1 tests nothing
            rate = self.max_pooled_mant_inexact_rate * f
            scaled["max_pooled_mant_inexact_rate"] = rate if rate < 1.0 else None
        return self.model_copy(update=scaled)

    @classmethod
    def paper(cls) -> Thresholds:
        """The TOPLOC paper's per-chunk thresholds (38 mismatches of 128, mantissa error mean
        10, median 8), no pooled tests: loose enough for any hardware, blind to subtle changes."""
        return cls(max_exp_mismatches=38, max_mant_err_mean=10.0, max_mant_err_median=8.0,
                   max_pooled_exp_mismatch_rate=None, max_pooled_mant_err_mean=None,
                   max_pooled_mant_inexact_rate=None)


@dataclass(frozen=True)
class RolloutStats:
    """Statistics pooled over all chunks of a rollout."""

    chunks: int
    exp_mismatch_rate: float
    mant_err_mean: float
    mant_inexact_rate: float


@dataclass(frozen=True)
class ProofVerdict:
    """The TOPLOC statistical verdict on the chunks of one rollout: do its proofs match the
    recomputation within the thresholds. Only one input of the validator's decision on a file
    (`meshrl.validator.replay`, as a `toploc` finding), never a decision itself."""

    accepted: bool
    reasons: list[str] = field(default_factory=list)
    stats: RolloutStats | None = None


def is_small(result: ChunkResult, th: Thresholds) -> bool:
    """Whether `result` is a small chunk: fewer than th.small_chunk_ratio x topk values."""
    return 0 < result.n_values < th.small_chunk_ratio * th.topk


def rollout_stats(results: Sequence[ChunkResult], topk: int = DEFAULT_TOPK,
                  small_chunk_ratio: float = 0.0) -> RolloutStats:
    """Pool the chunks of a rollout: mismatch rate, matched-entry mantissa error mean and the
    fraction of matched entries whose mantissa is not exact (chunks with a `reason` skipped,
    and small chunks: fewer than small_chunk_ratio x topk values)."""
    good = [r for r in results if r.reason is None
            and not 0 < r.n_values < small_chunk_ratio * topk]
    if not good:
        return RolloutStats(0, math.nan, math.nan, math.nan)
    matched = sum(r.n_matched for r in good)
    err_sum = sum(r.mant_err_mean * r.n_matched for r in good if r.n_matched)
    exact = sum(r.n_exact for r in good)
    return RolloutStats(
        chunks=len(good),
        exp_mismatch_rate=sum(r.exp_mismatches for r in good)
        / sum(_committed(r, topk) for r in good),
        mant_err_mean=err_sum / matched if matched else math.inf,
        mant_inexact_rate=1.0 - exact / matched if matched else 1.0,
    )


_CHUNK_TESTS = (
    ("exponent mismatches", "exp_mismatches", "max_exp_mismatches"),
    ("mantissa error mean", "mant_err_mean", "max_mant_err_mean"),
    ("mantissa error median", "mant_err_median", "max_mant_err_median"),
    ("sign mismatches", "sign_mismatches", "max_sign_mismatches"),
)
_SMALL_TESTS = (
    ("exponent mismatch rate", "exp_mismatch_rate", "max_small_exp_mismatch_rate"),
    ("mantissa error mean", "mant_err_mean", "max_small_mant_err_mean"),
    ("mantissa error median", "mant_err_median", "max_small_mant_err_median"),
    ("sign mismatches", "sign_mismatches", "max_small_sign_mismatches"),
)


def _committed(r: ChunkResult, topk: int) -> int:
    """Entries a chunk's proof commits to: topk, or all values of a chunk with fewer."""
    return min(topk, r.n_values) if r.n_values else topk


def _stat(r: ChunkResult, stat: str, topk: int = DEFAULT_TOPK) -> float:
    if stat == "exp_mismatch_rate":
        return r.exp_mismatches / _committed(r, topk)
    return getattr(r, stat)
_POOLED_TESTS = (
    ("exponent mismatch rate", "exp_mismatch_rate", "max_pooled_exp_mismatch_rate"),
    ("mantissa error mean", "mant_err_mean", "max_pooled_mant_err_mean"),
    ("inexact-mantissa rate", "mant_inexact_rate", "max_pooled_mant_inexact_rate"),
)


def verdict(results: Sequence[ChunkResult],
            thresholds: Thresholds | None = None) -> ProofVerdict:
    """Accept a rollout only if every chunk was checkable and every enabled test passes."""
    th = thresholds or Thresholds()
    reasons = []
    if not results:
        reasons.append("no chunks to verify")
    for i, r in enumerate(results):
        if r.reason is not None:
            reasons.append(r.reason)
            continue
        small = is_small(r, th)
        for name, stat, limit in _SMALL_TESTS if small else _CHUNK_TESTS:
            value, bound = _stat(r, stat, th.topk), getattr(th, limit)
            if not value <= bound:  # NaN fails too
                kind = f"small chunk ({r.n_values} values)" if small else "chunk"
                reasons.append(f"{kind} {i}: {name} {value:.4g} > {bound:.4g}")
    stats = rollout_stats(results, th.topk, th.small_chunk_ratio)
    if not reasons:
        for name, stat, limit in _POOLED_TESTS:
            value, bound = getattr(stats, stat), pooled_limits(th, stats.chunks)[limit]
            if bound is not None and not value <= bound:
                reasons.append(f"rollout: {name} {value:.4g} > {bound:.4g} "
                               f"({stats.chunks} chunks)")
    return ProofVerdict(accepted=not reasons, reasons=reasons, stats=stats)


def pooled_limits(th: Thresholds, chunks: int) -> dict[str, float | None]:
    """The pooled thresholds that apply to a rollout of `chunks` chunks (None: not tested).

    A pooled statistic is a mean over the rollout's chunks, so its honest spread shrinks like
    1 / sqrt(chunks): the thresholds hold as given from `pooled_full_chunks` on and are widened
    by sqrt(pooled_full_chunks / chunks) below, down to `min_pooled_chunks`. Every rollout is
    then tested with the strength its size allows; the old cliff (no pooled test at all below
    16 chunks) let int8 weights through in 13-chunk files (issue #22).
    """
    names = [limit for _, _, limit in _POOLED_TESTS]
    if chunks < th.min_pooled_chunks or chunks < 1:
        return dict.fromkeys(names)
    widen = math.sqrt(max(1.0, th.pooled_full_chunks / chunks))
    out: dict[str, float | None] = {}
    for limit in names:
        bound = getattr(th, limit)
        out[limit] = None if bound is None else bound * widen
    return out


def threshold_ratios(
    rollouts: Sequence[Sequence[ChunkResult]], thresholds: Thresholds
) -> dict[str, float]:
    """The largest value / threshold of every enabled test over `rollouts` (pooled tests over
    the rollouts long enough for them): how close honest work comes to rejection."""
    th = thresholds
    chunks = [c for ro in rollouts for c in ro if c.reason is None]
    small = [c for c in chunks if is_small(c, th)]
    full = [c for c in chunks if not is_small(c, th)]
    out = {}
    for _, stat, limit in _CHUNK_TESTS:
        values = [getattr(c, stat) for c in full]
        out[f"chunk.{stat}"] = _ratio(values, getattr(th, limit))
    for _, stat, limit in _SMALL_TESTS if small else ():
        out[f"small.{stat}"] = _ratio([_stat(c, stat, th.topk) for c in small],
                                      getattr(th, limit))
    pooled = [rollout_stats(ro, th.topk, th.small_chunk_ratio) for ro in rollouts]
    pooled = [p for p in pooled if p.chunks >= max(1, th.min_pooled_chunks)]
    for _, stat, limit in _POOLED_TESTS:
        if getattr(th, limit) is not None and pooled:  # each against the bound of its size
            out[f"pooled.{stat}"] = max(_ratio([getattr(p, stat)],
                                               pooled_limits(th, p.chunks)[limit] or 0.0)
                                        for p in pooled)
    return out


def _ratio(values: Sequence[float], bound: float) -> float:
    top = max(values, default=0.0)
    return top / bound if bound > 0 else (0.0 if top <= 0 else math.inf)


def tail_threshold(samples: Sequence[float], rate: float) -> float:
    """A value that honest `samples` exceed with probability about `rate` (upper tail).

    Empirical quantile where the sample resolves it (rate >= 10 / n), else an exponential tail
    fitted above the 90th percentile; never below max(samples).
    """
    xs = sorted(float(x) for x in samples if math.isfinite(x))
    if not xs:
        raise ValueError("no finite honest samples to calibrate on")
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1), got {rate}")
    n = len(xs)

    def quantile(q: float) -> float:
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    if rate >= 10.0 / n:
        return max(quantile(1.0 - rate), xs[0])
    q90 = quantile(0.9)
    excess = [x - q90 for x in xs if x > q90]
    beta = sum(excess) / len(excess) if excess else 0.0
    return max(q90 + beta * math.log(0.1 / rate), xs[-1])


def _fit(samples: Sequence[float], rate: float, margin: float, headroom: float) -> float:
    """tail_threshold with its distance from the honest median multiplied by `margin`, and at
    least max(samples) / headroom."""
    xs = sorted(float(x) for x in samples if math.isfinite(x))
    t = tail_threshold(xs, rate)
    center = xs[len(xs) // 2]
    return max(center + margin * (t - center), xs[-1] / headroom)


def calibrate_thresholds(
    honest_rollouts: Sequence[Sequence[ChunkResult]],
    fpr: float = 1e-4,
    chunks_per_rollout: int | None = None,
    topk: int = DEFAULT_TOPK,
    min_pooled_chunks: int = 16,
    chunk_margin: float = 3.0,
    pooled_margin: float = 2.0,
    headroom: float = HEADROOM,
    small_chunk_ratio: float = 0.0,
) -> Thresholds:
    """Thresholds that reject an honest rollout with probability about `fpr`, and sit at least
    1 / headroom above every honest value seen.

    The rate is split evenly over the seven tests (Bonferroni); per-chunk tests get a further
    share of 1 / chunks_per_rollout (default: the mean rollout length) since a rollout fails
    when any of its chunks does. Each fitted threshold's distance from the honest median is then
    multiplied by a margin: calibration sets are small and their chunks correlated (the same
    completions recomputed in several setups), so the fitted tail is itself uncertain. Single
    chunks have heavy honest tails, so they get the wider `chunk_margin`; the pooled rollout
    statistics average hundreds of entries, are tight, and carry the sensitive tests with
    `pooled_margin`. Per-chunk thresholds are capped at the paper's; the sign test keeps its
    default (honest work flips no sign: only an uncommitted index can, by chance).

    With `small_chunk_ratio` > 0, small chunks (fewer than that x topk values) are fitted apart:
    the small-chunk tests on them alone (capped at the paper's per-chunk values, as a rate for
    the mismatches), the per-chunk and pooled tests on the other chunks.
    """
    base = Thresholds(small_chunk_ratio=small_chunk_ratio, topk=topk)
    every = [r for ro in honest_rollouts for r in ro if r.reason is None]
    chunks = [r for r in every if not is_small(r, base)]
    small = [r for r in every if is_small(r, base)]
    if not chunks:
        raise ValueError("no honest chunks to calibrate on")
    if chunks_per_rollout is None:
        chunks_per_rollout = max(1, round(len(chunks) / max(1, len(honest_rollouts))))
    per_test = fpr / (len(CHUNK_STATS) + len(POOLED_STATS))
    per_chunk = per_test / chunks_per_rollout
    paper = Thresholds.paper()
    th: dict[str, float | None] = {}
    for stat in ("exp_mismatches", "mant_err_mean", "mant_err_median"):
        values = [getattr(c, stat) for c in chunks]
        fitted = _fit(values, per_chunk, chunk_margin, headroom)
        if stat != "mant_err_mean":  # integer-valued: the next integer, at least max + 1
            fitted = math.ceil(max(fitted, max(values) + 1))
        th[f"max_{stat}"] = min(fitted, getattr(paper, f"max_{stat}"))
    for stat in SMALL_STATS if small else ():
        values = [_stat(c, stat, topk) for c in small]
        fitted = _fit(values, per_chunk, chunk_margin, headroom)
        if stat in ("mant_err_median", "sign_mismatches"):
            fitted = math.ceil(max(fitted, max(values) + 1))
        th[f"max_small_{stat}"] = min(fitted, getattr(paper, f"max_small_{stat}"))
    pooled = [rollout_stats(ro, topk, small_chunk_ratio) for ro in honest_rollouts]
    pooled = [p for p in pooled if p.chunks >= min_pooled_chunks]
    for stat in POOLED_STATS:
        th[f"max_pooled_{stat}"] = (
            _fit([getattr(p, stat) for p in pooled], per_test, pooled_margin, headroom)
            if pooled else None
        )
    # fitted on rollouts of min_pooled_chunks or more: they hold as fitted from that size on
    return Thresholds(**th, topk=topk, min_pooled_chunks=min_pooled_chunks,
                      pooled_full_chunks=min_pooled_chunks, small_chunk_ratio=small_chunk_ratio)
