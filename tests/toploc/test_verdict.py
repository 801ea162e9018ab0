"""Verdicts, pooled statistics and threshold calibration."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.toploc import (
    HEADROOM,
    ChunkResult,
    Thresholds,
    calibrate_thresholds,
    pooled_limits,
    rollout_stats,
    tail_threshold,
    threshold_ratios,
    verdict,
)


def _chunk(exp=0, mean=0.0, median=0.0, n=128, exact=128):
    return ChunkResult(exp, mean, median, n, exact)


def test_paper_thresholds():
    th = Thresholds.paper()
    assert (th.max_exp_mismatches, th.max_mant_err_mean, th.max_mant_err_median) == (38, 10, 8)
    assert th.max_pooled_mant_err_mean is None
    assert verdict([_chunk(38, 10.0, 8.0)], th).accepted
    assert not verdict([_chunk(39, 0.0, 0.0)], th).accepted
    assert not verdict([_chunk(0, 10.5, 0.0)], th).accepted
    assert not verdict([_chunk(0, 0.0, 8.5)], th).accepted
    assert not verdict([_chunk(0, math.nan, 0.0)], th).accepted


def test_default_thresholds_are_tighter_than_the_papers():
    th, paper = Thresholds(), Thresholds.paper()
    assert th.max_exp_mismatches <= paper.max_exp_mismatches
    assert th.max_mant_err_mean < paper.max_mant_err_mean
    assert th.max_mant_err_median <= paper.max_mant_err_median
    assert None not in (th.max_pooled_exp_mismatch_rate, th.max_pooled_mant_err_mean,
                        th.max_pooled_mant_inexact_rate)
    assert verdict([_chunk(0, 0.4, 0.0, 128, 70)] * th.min_pooled_chunks).accepted
    signs = ChunkResult(0, 0.0, 0.0, 128, 128, sign_mismatches=th.max_sign_mismatches + 1)
    assert not verdict([signs]).accepted and "sign" in verdict([signs]).reasons[0]


def test_rollout_stats_hand_checked():
    s = rollout_stats([_chunk(2, 1.0, 1.0, 100, 50), _chunk(6, 0.5, 0.0, 50, 40)], topk=128)
    assert s.chunks == 2
    assert s.exp_mismatch_rate == pytest.approx(8 / 256)
    assert s.mant_err_mean == pytest.approx((100 + 25) / 150)
    assert s.mant_inexact_rate == pytest.approx(60 / 150)


def test_pooled_tests_catch_what_chunks_miss():
    th = Thresholds(max_mant_err_mean=1.0, max_pooled_mant_err_mean=0.5, min_pooled_chunks=4,
                    pooled_full_chunks=4)
    slightly_off = [_chunk(1, 0.7, 1.0, 128, 60)] * 8
    assert verdict(slightly_off, th.model_copy(update={"max_pooled_mant_err_mean": None})).accepted
    v = verdict(slightly_off, th)
    assert not v.accepted and "rollout" in v.reasons[0]
    assert verdict(slightly_off[:3], th).accepted  # too short for pooled tests
    th_inexact = Thresholds(max_pooled_mant_inexact_rate=0.4, min_pooled_chunks=1,
                            pooled_full_chunks=1)
    assert not verdict([_chunk(0, 0.1, 0.0, 128, 70)], th_inexact).accepted
    assert verdict([_chunk(0, 0.1, 0.0, 128, 90)], th_inexact).accepted


def test_small_rollouts_are_pooled_against_widened_thresholds():
    """No gap below 16 chunks (issue #22): every rollout is pooled, the thresholds widened by
    sqrt(16 / n) where the mean of n chunks spreads more."""
    th = Thresholds()
    assert (th.min_pooled_chunks, th.pooled_full_chunks) == (1, 16)
    assert pooled_limits(th, 16)["max_pooled_mant_err_mean"] == pytest.approx(0.78)
    assert pooled_limits(th, 64)["max_pooled_mant_err_mean"] == pytest.approx(0.78)
    assert pooled_limits(th, 4)["max_pooled_mant_err_mean"] == pytest.approx(1.56)
    assert pooled_limits(th, 13)["max_pooled_exp_mismatch_rate"] == pytest.approx(
        0.048 * math.sqrt(16 / 13))
    assert pooled_limits(th.model_copy(update={"min_pooled_chunks": 5}), 4) == dict.fromkeys(
        ["max_pooled_exp_mismatch_rate", "max_pooled_mant_err_mean",
         "max_pooled_mant_inexact_rate"])
    # 13 chunks of mantissa error mean 0.9 (each far below the chunk test's 3.0): rejected now
    # (0.9 > 0.78 x 1.109 = 0.8653), at 4 chunks passed (< 1.56)
    off = [_chunk(1, 0.9, 1.0, 128, 60)]
    v = verdict(off * 13, th)
    assert not v.accepted and "rollout: mantissa error mean 0.9 > 0.8653 (13 chunks)" in v.reasons
    assert verdict(off * 4, th).accepted
    r = threshold_ratios([off * 4, off * 16], th)
    assert r["pooled.mant_err_mean"] == pytest.approx(0.9 / 0.78)  # each against its own size


def test_threshold_ratios_hand_checked():
    th = Thresholds(max_exp_mismatches=10, max_mant_err_mean=2.0, max_mant_err_median=2.0,
                    max_pooled_exp_mismatch_rate=None, max_pooled_mant_err_mean=1.0,
                    max_pooled_mant_inexact_rate=0.5, min_pooled_chunks=2, pooled_full_chunks=2)
    ro = [_chunk(4, 0.6, 1.0, 100, 80), _chunk(2, 0.2, 0.0, 100, 90)]
    r = threshold_ratios([ro, ro[:1]], th)  # the second rollout is too short to pool
    assert r["chunk.exp_mismatches"] == pytest.approx(0.4)
    assert r["chunk.mant_err_mean"] == pytest.approx(0.3)
    assert r["chunk.mant_err_median"] == pytest.approx(0.5)
    assert r["pooled.mant_err_mean"] == pytest.approx(0.4)  # (60 + 20) / 200
    assert r["pooled.mant_inexact_rate"] == pytest.approx(0.15 / 0.5)  # 1 - 170 / 200
    assert "pooled.exp_mismatch_rate" not in r


def test_tail_threshold_hand_checked():
    xs = list(range(1, 101))  # 1..100
    assert tail_threshold(xs, 0.5) == pytest.approx(50.5)
    # rate < 10/n: exponential tail above q90 = 90.1; mean excess of 91..100 over it = 5.4
    assert tail_threshold(xs, 0.001) == pytest.approx(90.1 + 5.4 * math.log(100))
    assert tail_threshold([3.0] * 50, 1e-6) == 3.0
    with pytest.raises(ValueError):
        tail_threshold([], 0.1)
    with pytest.raises(ValueError):
        tail_threshold([1.0], 0.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e3), min_size=1, max_size=200), st.floats(1e-9, 0.5))
def test_tail_threshold_properties(xs, rate):
    t = tail_threshold(xs, rate)
    assert t >= min(xs)
    if rate < 10 / len(xs):
        assert t >= max(xs)
    assert tail_threshold(xs, rate / 10) >= t - 1e-9  # rarer -> higher


def test_calibration_accepts_its_honest_data_with_headroom():
    honest = [
        [_chunk(i % 5, 0.3 + 0.01 * (i % 7), 0.0, 128, 90 + i % 5) for i in range(j, j + 16)]
        for j in range(40)
    ]
    th = calibrate_thresholds(honest, fpr=1e-3, chunk_margin=1.0, pooled_margin=1.0)
    # integer statistics: at least max + 1 and max / 0.7; means: at least max / 0.7
    assert th.max_exp_mismatches == 6 and th.max_mant_err_median == 1
    assert th.max_mant_err_mean == pytest.approx(0.36 / HEADROOM)
    assert all(verdict(ro, th).accepted for ro in honest)
    assert max(threshold_ratios(honest, th).values()) <= HEADROOM + 1e-12
    cheat = [_chunk(3, 0.6, 0.0, 128, 60)] * 16
    assert verdict(cheat, Thresholds.paper()).accepted and not verdict(cheat, th).accepted
    with pytest.raises(ValueError):
        calibrate_thresholds([[ChunkResult(-1, math.inf, math.inf, reason="bad")]])


def test_margin_widens_from_the_median():
    honest = [[_chunk(i % 5, 0.2 + 0.01 * i, 0.0, 128, 100) for i in range(16)]] * 20
    tight = calibrate_thresholds(honest, fpr=1e-3, chunk_margin=2.0, headroom=1.0)
    wide = calibrate_thresholds(honest, fpr=1e-3, chunk_margin=4.0, headroom=1.0)
    median = sorted(0.2 + 0.01 * i for i in range(16))[8]
    assert wide.max_mant_err_mean - median == pytest.approx(2 * (tight.max_mant_err_mean - median))
    assert wide.max_exp_mismatches >= tight.max_exp_mismatches


def test_calibration_never_loosens_the_papers_chunk_thresholds():
    noisy = [[_chunk(30 + i % 9, 6.0 + i % 5, 5.0 + i % 4, 128, 10) for i in range(16)]] * 10
    th = calibrate_thresholds(noisy, fpr=1e-3)
    assert (th.max_exp_mismatches, th.max_mant_err_mean, th.max_mant_err_median) == (38, 10, 8)


def _smollm2_bf16_file(chunks: int = 32) -> list[ChunkResult]:
    """Chunks shaped like honest GPU bfloat16 work on SmolLM2-135M (30 layers) checked in
    float32 (issue #40): pooled mantissa error mean 2.2, one chunk 4.1, 81% inexact."""
    rest = [_chunk(3, 2.15, 1.0, 128, 24) for _ in range(chunks - 1)]
    return [_chunk(3, 4.08, 3.0, 128, 24), *rest]


def test_deep_models_widen_the_noise_driven_bounds():
    """Issue #40: bounds calibrated on 2-4 layer models slashed honest bfloat16 work on a
    30-layer model; `for_depth` widens the noise-driven ones by (layers / 4)."""
    th = Thresholds()
    honest = _smollm2_bf16_file()
    assert not verdict(honest, th).accepted  # the tiny models' bounds: slashed
    deep = th.for_depth(30)
    assert th.depth_factor(30) == pytest.approx(7.5)
    assert verdict(honest, deep).accepted
    assert max(threshold_ratios([honest], deep).values()) <= HEADROOM
    assert deep.max_pooled_mant_err_mean == pytest.approx(0.78 * 7.5)
    assert deep.max_mant_err_mean == 10.0  # capped at the paper's
    assert deep.max_pooled_mant_inexact_rate is None  # x7.5 > 1: honest bf16 reaches 0.81
    assert deep.max_inexact_token_rate == pytest.approx(0.005 * 7.5 ** 1.1)
    assert deep.max_logprob_abs_mean == pytest.approx(0.05 * 7.5 ** 0.5)
    assert deep.max_logprob_diff == pytest.approx(0.5 * 7.5 ** 0.5)
    # the exponent tests, the sampling margin and the top_p slack are not widened
    assert (deep.max_exp_mismatches, deep.max_pooled_exp_mismatch_rate,
            deep.max_sampling_margin, deep.top_p_slack) == (38, 0.048, 0.5, 0.04)
    # the models the bounds were calibrated on, and an unknown depth, keep them as they are
    assert th.for_depth(4) == th and th.for_depth(2) == th and th.for_depth(None) == th
    assert Thresholds(depth_exponent=0.0).for_depth(30) == Thresholds(depth_exponent=0.0)
    # int4 weights on that model (measured: pooled mantissa error mean 21.9, 45 exponent
    # mismatches in a chunk) stay far outside
    int4 = [_chunk(45, 31.4, 23.0, 83, 2)] + [_chunk(20, 21.9, 16.0, 108, 3)] * 31
    assert not verdict(int4, deep).accepted
