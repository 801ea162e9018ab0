"""Small chunks (issue #26): a short last chunk is judged by what it can show.

A 1-token last chunk at hidden size 128 has 128 values, so top-128 takes all of them, near-zero
ones included; honest bfloat16 work then showed a mantissa error mean of up to 4.06 there
against the full-chunk limit of 3. Such a chunk (fewer than small_chunk_ratio x topk values) is
judged by the small-chunk thresholds and left out of the pooled statistics; a chunk of fewer
values than topk (hidden size 64) commits to all of them. The precision matrix here is a subset
of benchmarks/bench_calibration.py (full counts: benchmarks/README.md).
"""

import pytest
import torch

from meshrl.toploc import ChunkResult, Thresholds, rollout_stats, threshold_ratios, verdict
from meshrl.toploc.matrix import MATRIX_VALIDATORS, MATRIX_WORKERS, cheats, judge, prove, tiny_model
from meshrl.toploc.thresholds import calibrate_thresholds, is_small


def _chunk(exp=0, mean=0.0, median=0.0, n=128, exact=128, values=4096):
    return ChunkResult(exp, mean, median, n, exact, n_values=values)


def test_a_small_chunk_is_judged_by_the_small_chunk_thresholds():
    th = Thresholds()
    last = _chunk(2, 4.06, 3.0, 126, 20, values=128)  # the 1-token chunk at hidden 128
    assert is_small(last, th) and not is_small(_chunk(), th) and not is_small(
        ChunkResult(0, 0.0, 0.0, 128, 128), th)  # n_values unknown: a full chunk
    assert verdict([last], th).accepted
    full = _chunk(2, 4.06, 3.0, 126, 20)
    v = verdict([full], th)
    assert not v.accepted and v.reasons == ["chunk 0: mantissa error mean 4.06 > 3"]
    # an unrelated model's values: most exponents differ, in a small chunk too
    other = _chunk(50, 1.0, 1.0, 78, 10, values=128)
    v = verdict([other], th)
    assert not v.accepted and "small chunk (128 values) 0: exponent mismatch rate 0.3906" \
        in v.reasons[0]
    # a chunk of 64 values (hidden 64, 1 token): its rate counts its 64 committed entries
    assert not verdict([_chunk(20, 0.5, 0.0, 44, 30, values=64)], th).accepted  # 0.31
    assert verdict([_chunk(19, 0.5, 0.0, 45, 30, values=64)], th).accepted  # 0.297


def test_small_chunks_stay_out_of_the_pooled_statistics():
    th = Thresholds()
    clean = [_chunk(0, 0.1, 0.0, 128, 100)] * 16
    noisy_last = _chunk(4, 5.0, 4.0, 124, 10, values=256)
    s = rollout_stats([*clean, noisy_last], th.topk, th.small_chunk_ratio)
    assert s.chunks == 16 and s.mant_err_mean == pytest.approx(0.1)
    assert verdict([*clean, noisy_last], th).accepted
    assert rollout_stats([noisy_last], th.topk, th.small_chunk_ratio).chunks == 0
    r = threshold_ratios([[*clean, noisy_last]], th)
    assert r["small.mant_err_mean"] == pytest.approx(5.0 / th.max_small_mant_err_mean)
    assert r["chunk.mant_err_mean"] == pytest.approx(0.1 / th.max_mant_err_mean)


def test_calibration_fits_small_chunks_apart():
    honest = [[_chunk(1, 0.3 + 0.01 * i, 0.0, 127, 60), _chunk(3, 2.0 + 0.02 * i, 1.0, 125, 30,
                                                               values=128)]
              for i in range(50)]
    th = calibrate_thresholds(honest, small_chunk_ratio=8.0, min_pooled_chunks=1)
    assert th.small_chunk_ratio == 8.0
    assert th.max_mant_err_mean < 2.0 <= 2.98 / 0.7 <= th.max_small_mant_err_mean <= 10.0
    assert th.max_small_mant_err_median >= 2 and th.max_small_exp_mismatch_rate <= 0.3
    assert all(verdict(ro, th).accepted for ro in honest)


@pytest.fixture(scope="module")
def small_model():
    return tiny_model(64)


def test_honest_short_completions_in_every_precision_pass_with_headroom(small_model):
    """Hidden 64, final chunks of 1 .. 32 tokens, bf16 and fp16 workers, fp32 and own-dtype
    validators: every file accepted, every statistic at most 70% of its threshold."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 100, (5,), generator=g).tolist() for _ in range(16)]
    lengths = [1 + (i * 7) % 40 for i in range(16)]
    th, files = Thresholds(), []
    for w in (MATRIX_WORKERS[2], MATRIX_WORKERS[4]):
        work = prove(small_model, w, prompts, lengths, seed=1)
        for v in (MATRIX_VALIDATORS[0], MATRIX_VALIDATORS[3]):
            ros = judge(small_model, v, w.dtype, prompts, work)
            files += [[c for ro in ros[i:i + 8] for c in ro] for i in (0, 8)]
    assert sum(is_small(c, th) for f in files for c in f) >= 20
    assert all(verdict(f, th).accepted for f in files)
    assert max(threshold_ratios(files, th).values()) <= 0.7


def test_another_model_is_rejected_even_in_one_token_files(small_model):
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, 100, (5,), generator=g).tolist() for _ in range(4)]
    other = next(c for c in cheats(64) if c.name == "other_model").change(small_model)
    work = prove(other, MATRIX_WORKERS[2], prompts, [1, 1, 2, 3], seed=2)
    ros = judge(small_model, MATRIX_VALIDATORS[0], "bfloat16", prompts, work)
    assert all(is_small(ro[0], Thresholds()) for ro in ros)
    assert not any(verdict(ro).accepted for ro in ros)
