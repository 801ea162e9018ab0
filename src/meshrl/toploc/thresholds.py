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
`calibrate_thresholds` then widens each threshold's distance from the honest median by a margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

from meshrl.config import Config
from meshrl.toploc.proofs import DEFAULT_TOPK, ChunkResult

__all__ = [
    "RolloutStats",
    "Thresholds",
    "Verdict",
    "calibrate_thresholds",
    "rollout_stats",
    "tail_threshold",
    "verdict",
]

# per-chunk statistics and pooled (rollout) statistics, each with a threshold field below
CHUNK_STATS = ("exp_mismatches", "mant_err_mean", "mant_err_median")
POOLED_STATS = ("exp_mismatch_rate", "mant_err_mean", "mant_err_zero_rate")


class Thresholds(Config):
    """Largest accepted values; None disables a pooled test. Defaults: the TOPLOC paper's."""

    max_exp_mismatches: float = Field(38, description="per chunk: sign/exponent mismatches")
    max_mant_err_mean: float = Field(10.0, description="per chunk: mean |mantissa difference|")
    max_mant_err_median: float = Field(8.0, description="per chunk: median |mantissa difference|")
    max_sign_mismatches: int = Field(
        4, description="per chunk: sign flips among exponent-matched entries"
    )
    max_pooled_exp_mismatch_rate: float | None = Field(
        None, description="rollout: mismatches / compared entries over all chunks"
    )
    max_pooled_mant_err_mean: float | None = Field(
        None, description="rollout: mean |mantissa difference| over all matched entries"
    )
    min_pooled_mant_err_zero_rate: float | None = Field(
        None, description="rollout: smallest accepted fraction of bit-exact matched mantissas"
    )
    min_pooled_chunks: int = Field(
        4, description="pooled tests apply only to rollouts with at least this many chunks"
    )
    topk: int = Field(DEFAULT_TOPK, description="entries committed per chunk")


@dataclass(frozen=True)
class RolloutStats:
    """Statistics pooled over all chunks of a rollout."""

    chunks: int
    exp_mismatch_rate: float
    mant_err_mean: float
    mant_err_zero_rate: float


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    stats: RolloutStats | None = None


def rollout_stats(results: Sequence[ChunkResult], topk: int = DEFAULT_TOPK) -> RolloutStats:
    """Pool the chunks of a rollout: mismatch rate, matched-entry mantissa error mean and the
    fraction of matched entries with an exact mantissa (chunks with a `reason` are skipped)."""
    good = [r for r in results if r.reason is None]
    if not good:
        return RolloutStats(0, math.nan, math.nan, math.nan)
    matched = sum(r.n_matched for r in good)
    err_sum = sum(r.mant_err_mean * r.n_matched for r in good if r.n_matched)
    zeros = sum(r.n_exact for r in good)
    return RolloutStats(
        chunks=len(good),
        exp_mismatch_rate=sum(r.exp_mismatches for r in good) / (topk * len(good)),
        mant_err_mean=err_sum / matched if matched else math.inf,
        mant_err_zero_rate=zeros / matched if matched else 0.0,
    )


def verdict(results: Sequence[ChunkResult], thresholds: Thresholds | None = None) -> Verdict:
    """Accept a rollout only if every chunk was checkable and every enabled test passes."""
    th = thresholds or Thresholds()
    reasons = []
    if not results:
        reasons.append("no chunks to verify")
    for i, r in enumerate(results):
        if r.reason is not None:
            reasons.append(r.reason)
            continue
        checks = (
            ("exponent mismatches", r.exp_mismatches, th.max_exp_mismatches),
            ("mantissa error mean", r.mant_err_mean, th.max_mant_err_mean),
            ("mantissa error median", r.mant_err_median, th.max_mant_err_median),
            ("sign mismatches", r.sign_mismatches, th.max_sign_mismatches),
        )
        for name, value, limit in checks:
            if not value <= limit:  # NaN fails too
                reasons.append(f"chunk {i}: {name} {value:.4g} > {limit:.4g}")
    stats = rollout_stats(results, th.topk)
    if not reasons and stats.chunks >= th.min_pooled_chunks:
        if th.max_pooled_exp_mismatch_rate is not None and not (
            stats.exp_mismatch_rate <= th.max_pooled_exp_mismatch_rate
        ):
            reasons.append(f"rollout: exponent mismatch rate {stats.exp_mismatch_rate:.4g} > "
                           f"{th.max_pooled_exp_mismatch_rate:.4g}")
        if th.max_pooled_mant_err_mean is not None and not (
            stats.mant_err_mean <= th.max_pooled_mant_err_mean
        ):
            reasons.append(f"rollout: mantissa error mean {stats.mant_err_mean:.4g} > "
                           f"{th.max_pooled_mant_err_mean:.4g}")
        if th.min_pooled_mant_err_zero_rate is not None and not (
            stats.mant_err_zero_rate >= th.min_pooled_mant_err_zero_rate
        ):
            reasons.append(f"rollout: exact-mantissa rate {stats.mant_err_zero_rate:.4g} < "
                           f"{th.min_pooled_mant_err_zero_rate:.4g}")
    return Verdict(accepted=not reasons, reasons=reasons, stats=stats)


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


def _widen(samples: Sequence[float], rate: float, margin: float) -> float:
    """tail_threshold, with its distance from the honest median multiplied by `margin`."""
    xs = sorted(float(x) for x in samples if math.isfinite(x))
    t = tail_threshold(xs, rate)
    center = xs[len(xs) // 2]
    return center + margin * (t - center)


def calibrate_thresholds(
    honest_rollouts: Sequence[Sequence[ChunkResult]],
    fpr: float = 1e-3,
    chunks_per_rollout: int | None = None,
    topk: int = DEFAULT_TOPK,
    min_pooled_chunks: int = 4,
    chunk_margin: float = 3.0,
    pooled_margin: float = 2.0,
) -> Thresholds:
    """Thresholds that reject an honest rollout with probability about `fpr`.

    The rate is split evenly over the six tests (Bonferroni); per-chunk tests get a further
    share of 1 / chunks_per_rollout (default: the mean rollout length) since a rollout fails
    when any of its chunks does. Each fitted threshold's distance from the honest median is then
    multiplied by a margin: calibration sets are small and their chunks correlated (the same
    completions recomputed in several modes), so the fitted tail is itself uncertain. Single
    chunks have heavy honest tails (one chunk of fp32-vs-bf16 recomputation may sit at twice the
    median error), so they get the wider `chunk_margin`; the pooled rollout statistics average
    hundreds of entries, are tight, and carry the sensitive tests with `pooled_margin`.
    Per-chunk thresholds are capped at the paper's defaults.
    """
    chunks = [r for ro in honest_rollouts for r in ro if r.reason is None]
    if not chunks:
        raise ValueError("no honest chunks to calibrate on")
    if chunks_per_rollout is None:
        chunks_per_rollout = max(1, round(len(chunks) / max(1, len(honest_rollouts))))
    per_test = fpr / (len(CHUNK_STATS) + len(POOLED_STATS))
    per_chunk = per_test / chunks_per_rollout
    th = {
        "max_exp_mismatches": math.floor(
            _widen([c.exp_mismatches for c in chunks], per_chunk, chunk_margin)
        ),
        "max_mant_err_mean": _widen([c.mant_err_mean for c in chunks], per_chunk, chunk_margin),
        "max_mant_err_median": _widen(
            [c.mant_err_median for c in chunks], per_chunk, chunk_margin
        ),
    }
    pooled = [rollout_stats(ro, topk) for ro in honest_rollouts]
    pooled = [p for p in pooled if p.chunks >= min_pooled_chunks]
    if pooled:
        th["max_pooled_exp_mismatch_rate"] = _widen(
            [p.exp_mismatch_rate for p in pooled], per_test, pooled_margin
        )
        th["max_pooled_mant_err_mean"] = _widen(
            [p.mant_err_mean for p in pooled], per_test, pooled_margin
        )
        # a lower tail: fit the upper tail of 1 - rate
        th["min_pooled_mant_err_zero_rate"] = 1.0 - _widen(
            [1.0 - p.mant_err_zero_rate for p in pooled], per_test, pooled_margin
        )
    # calibration only ever tightens the paper's per-chunk thresholds
    default = Thresholds()
    for name in ("max_exp_mismatches", "max_mant_err_mean", "max_mant_err_median"):
        th[name] = min(th[name], getattr(default, name))
    return Thresholds(**th, topk=topk, min_pooled_chunks=min_pooled_chunks)
