"""Every replay tolerance against honest noise and against the cheapest exploit of it (issue #22).

Honest side: a subset of `benchmarks/bench_honest_margin.py` (every engine and precision on the
CPU, top_p 1.0 and 0.9, 2 to 32 chunks per file) judged by the real checks: nothing rejected,
and the float32 files far inside the tight "meshrl-cpu-engine" tolerances. Cheating side, each
through `verify_files` with a profile's thresholds, a hard finding expected: tokens chosen
inside the old sampling tolerance, another top_p than the pool's, biased log-probs, int8 or
scaled-layer decoding followed by an honest prefill, and weight cheats in files too small for
the old pooled tests. What each profile still lets through is asserted as a number (the bounds
of docs/roles.md, "Tolerances").
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import NODE, PROVIDER

from meshrl.inference import CPUEngine, EngineConfig, ReferenceBackend, ReferenceConfig
from meshrl.inference import reference as reference_module
from meshrl.inference.sampling import _scores
from meshrl.pool import Assignment, Check, VerdictKind
from meshrl.toploc import build_proofs
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.validator.replay import ReplayConfig, inexact_token_limit, profile_thresholds
from meshrl.validator.verify import verify_files
from meshrl.worker.rollouts import generate_rollouts

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_honest_margin as bench

TIGHT, LOOSE = "meshrl-cpu-engine", "any-hardware"


def _judge(engine, tok, rf, rules, profile):
    cfg = ReplayConfig(thresholds=profile_thresholds(profile))
    return verify_files(engine, tok, [(rf, bench.claim_of(rf))], rules, rules.task.build(),
                        cfg)[0]


def _hard(decision, check: Check) -> bool:
    """A hard invalidation that names `check` among its failed checks."""
    return decision.kind is VerdictKind.HARD_INVALID and check in decision.checks


def test_profile_tolerances_reach_the_replay():
    loose, tight = ReplayConfig(), ReplayConfig(thresholds=profile_thresholds(TIGHT))
    assert (loose.sampling_tolerance, loose.logprob_atol) == (0.5, 0.5)
    assert (tight.sampling_tolerance, tight.logprob_atol) == (1e-4, 1e-3)
    assert ReplayConfig(logprob_atol=0.1).logprob_atol == 0.1  # an explicit one stays
    assert inexact_token_limit(0, 0.005) == 1 and inexact_token_limit(2000, 0.005) == 20
    assert inexact_token_limit(10_000, 0.0) == 1


def test_the_replay_widens_noise_bounds_for_a_deep_model(tok):
    """Issue #40: the replay judges by the profile's thresholds widened for the depth of the
    model it runs (`Thresholds.for_depth`): on a 30-layer model every noise-driven bound of
    any-hardware is x(30 / 4), and meshrl-cpu-engine's bounds stay as they are."""
    from meshrl.model import build_model
    from meshrl.validator.replay import model_layers

    deep = build_model("qwen2-tiny", tok.vocab_size, seed=5, num_hidden_layers=30,
                       hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2)
    engine = CPUEngine(deep, tok, EngineConfig(num_threads=1))
    ref = ReferenceBackend(deep, tok, ReferenceConfig())
    assert model_layers(engine) == model_layers(ref) == 30
    rules = bench.make_rules(32, 8, 1, ignore_eos=True)  # 8 chunks: pooled x sqrt(16 / 8)
    rf = bench.make_file(engine, tok, rules, 0)
    factor = 7.5
    loose, tight = _judge(engine, tok, rf, rules, LOOSE), _judge(ref, tok, rf, rules, TIGHT)
    assert loose.accepted and tight.accepted, (loose.reason, tight.reason)
    assert loose.stats["depth_factor"] == pytest.approx(factor)
    assert loose.stats["pooled_limits"]["mant_err_mean"] == pytest.approx(0.78 * factor * 2 ** .5)
    assert "mant_inexact_rate" not in loose.stats["pooled_limits"]  # x7.5: no test left
    assert loose.stats["inexact_limit"] == inexact_token_limit(256, 0.005 * factor ** 1.1)
    assert loose.stats["logprob_abs_limit"] == pytest.approx(
        (0.05 + 0.2 / 256 ** 0.5) * factor ** 0.5)
    assert tight.stats["depth_factor"] == 1.0
    assert tight.stats["pooled_limits"]["mant_err_mean"] == 0.05


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_honest_margin_subset(model, tok):
    """10 files per (worker, top_p): 80 honest files, 140 judgements, none rejected."""
    lines = bench.honest_configs(model, tok, 2, list(bench.WORKERS), lambda _: None)
    assert sum(x["files"] for x in lines if x["profile"] == LOOSE) == 80
    for x in lines:
        assert x["accepted"] == x["files"], x
        assert max(x["margin"].values()) < 1.0, x
        if x["dtype"] == "float32":  # nearly bit-exact: far inside even the tight profile
            assert max(x["margin"].values()) <= 0.05, x


def _picking_sampler(tol: float):
    """A worker's sampler that takes the runner-up whenever it scores within `tol` of the
    sampler's pick: free choice among near-ties (e.g. towards a higher reward)."""

    def pick(logits, seed, seq_ids, positions, temperature=1.0, top_p=1.0):
        scores = _scores(logits, seed, seq_ids, positions, temperature, top_p)
        top = scores.topk(2, dim=-1)
        near = (top.values[:, 0] - top.values[:, 1]) <= tol
        return torch.where(near, top.indices[:, 1], top.indices[:, 0])

    return pick


def test_tokens_chosen_inside_the_old_tolerance_are_rejected(model, tok, engine, monkeypatch):
    rules = bench.make_rules(64, 8, 4)
    worker = ReferenceBackend(model, tok, ReferenceConfig(max_batch_size=32))
    honest = bench.make_file(worker, tok, rules, 0)
    monkeypatch.setattr(reference_module, "sample_tokens", _picking_sampler(0.05))
    cheat = bench.make_file(worker, tok, rules, 0)
    for profile in (TIGHT, LOOSE):
        assert _judge(engine, tok, honest, rules, profile).accepted
        assert _hard(_judge(engine, tok, cheat, rules, profile), Check.SAMPLING)
    # inside the any-hardware tolerance itself: each chosen token passes, their number is
    # bounded by the inexact-token allowance (0.5% of tokens + 3 sigma + 1)
    monkeypatch.setattr(reference_module, "sample_tokens", _picking_sampler(0.0099))
    edge = bench.make_file(worker, tok, rules, 0)
    d = _judge(engine, tok, edge, rules, LOOSE)
    tokens, inexact = d.stats["tokens"], d.stats["inexact_tokens"]
    assert inexact > 0 and inexact / tokens < 0.02, (inexact, tokens)
    assert d.accepted == (inexact <= inexact_token_limit(tokens, 0.005))
    assert _hard(_judge(engine, tok, edge, rules, TIGHT), Check.SAMPLING)


def _with_rules_of(rf, rules):
    """A file generated under other sampling rules, its header claiming `rules`."""
    return replace(rf, header=rf.header.model_copy(update={"rules_sha256": rules.digest()}))


@pytest.mark.parametrize("used", [0.92, 0.88])
def test_another_top_p_than_the_pools_is_rejected(model, tok, engine, used):
    pool = bench.make_rules(64, 8, 4, top_p=0.9)
    used_rules = bench.make_rules(64, 8, 4, top_p=used)
    cheat = _with_rules_of(bench.make_file(engine, tok, used_rules, 0), pool)
    tight = _judge(engine, tok, cheat, pool, TIGHT)
    assert _hard(tight, Check.SAMPLING), tight.reason
    loose = _judge(engine, tok, cheat, pool, LOOSE)  # per token inside the 0.04 slack: counted
    assert _hard(loose, Check.SAMPLING) and "not exactly" in loose.reason, loose.reason
    assert loose.stats["inexact_tokens"] > loose.stats["inexact_limit"]


def _shifted(rf, shift):
    rows = [replace(r, logprobs=[x + shift(i) for i, x in enumerate(r.logprobs)])
            for r in rf.completions]
    return replace(rf, completions=rows)


def test_biased_logprobs_are_rejected_and_the_rest_is_bounded(engine, tok):
    rules = bench.make_rules(64, 4, 4)
    rf = bench.make_file(engine, tok, rules, 0)
    tokens = sum(len(r.logprobs) for r in rf.completions)
    limit = 0.002 + 0.2 / tokens ** 0.5  # any-hardware's bias limit at this file's length
    assert 0.004 < limit < 0.015, (tokens, limit)
    for bias in (0.049, 0.015):  # the issue's, then below the per-token tolerance
        d = _judge(engine, tok, _shifted(rf, lambda i, b=bias: b), rules, LOOSE)
        assert _hard(d, Check.LOGPROBS), (bias, d.reason)
        assert d.stats["logprob_bias_limit"] == pytest.approx(limit, rel=0.02)
    # 0.004 on every token is inside bf16's honest mean noise at this length: any-hardware
    # takes it (each ratio x1.004), the float32 profile never does
    small = _shifted(rf, lambda i: 0.004)
    assert _judge(engine, tok, small, rules, LOOSE).accepted
    assert _hard(_judge(engine, tok, small, rules, TIGHT), Check.LOGPROBS)
    # an alternating +-0.015 keeps the mean honest: passes any-hardware (each ratio moves by
    # at most exp(0.015) = x1.015 here; the per-token bound is 0.5), never the float32 profile
    wiggle = _shifted(rf, lambda i: 0.015 if i % 2 else -0.015)
    assert _judge(engine, tok, wiggle, rules, LOOSE).accepted
    assert _hard(_judge(engine, tok, wiggle, rules, TIGHT), Check.LOGPROBS)



def test_a_sign_balanced_logprob_bias_is_rejected_and_honest_bf16_is_not(model, tok, engine):
    """Issue #41: +0.45 on half the tokens and -0.45 on the rest (each below any-hardware's
    per-token 0.5) has a zero mean, so the bias test never saw it, and it moved the trainer's
    ratios x1.57 / x0.64. The mean |difference| sees it; honest bfloat16 and float32 files stay
    far inside that bound (bfloat16 on 8x sharper logits: at most 0.065 of it)."""
    import copy
    import itertools
    import random

    rules = bench.make_rules(64, 4, 4)
    rf = bench.make_file(engine, tok, rules, 0)
    n = sum(len(r.logprobs) for r in rf.completions)
    for order in (list(range(n)), random.Random(5).sample(range(n), n)):  # alternate, scatter
        sign = {t: 0.45 if k % 2 else -0.45 for k, t in enumerate(order[:n - n % 2])}
        starts = list(itertools.accumulate([0] + [len(r.logprobs) for r in rf.completions]))
        rows = [replace(r, logprobs=[x + sign.get(starts[j] + i, 0.0)
                                     for i, x in enumerate(r.logprobs)])
                for j, r in enumerate(rf.completions)]
        forged = replace(rf, completions=rows)
        d = _judge(engine, tok, forged, rules, LOOSE)
        assert _hard(d, Check.LOGPROBS) and "mean |difference|" in d.reason, d.reason
        assert abs(d.stats["logprob_bias"]) < d.stats["logprob_bias_limit"]  # unseen before
        assert _hard(_judge(engine, tok, forged, rules, TIGHT), Check.LOGPROBS)
    # honest: float32 under both profiles, bfloat16 (8x sharper logits, as a trained policy
    # has) under any-hardware
    d = _judge(engine, tok, rf, rules, TIGHT)
    assert d.accepted and d.stats["logprob_abs_mean"] <= 0.05 * d.stats["logprob_abs_limit"]
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(8.0)
    validator = CPUEngine(sharp, tok, EngineConfig(num_threads=1))
    worker = ReferenceBackend(copy.deepcopy(sharp).to(torch.bfloat16), tok,
                              ReferenceConfig(max_batch_size=8))
    for counter in range(3):
        bf = bench.make_file(worker, tok, rules, counter)
        d = _judge(validator, tok, bf, rules, LOOSE)
        assert d.accepted, d.reason
        assert 0 < d.stats["logprob_abs_mean"] <= 0.2 * d.stats["logprob_abs_limit"], d.stats

def _cheap_decode_honest_prefill(bad_model, model, tok, rules, counter=0):
    """Tokens decoded with `bad_model` (cheaper: int8, or one layer changed), then one honest
    prefill for the log-probs and the proofs: only the tokens betray the cheap decode."""
    bad = CPUEngine(bad_model, tok, EngineConfig(num_threads=1))
    honest = CPUEngine(model, tok, EngineConfig(num_threads=1))
    a = Assignment(rules, NODE, counter, 0)
    rf = generate_rollouts(bad, tok, a, rules.task.build(), PROVIDER)
    rows = rf.completions
    scored = honest.score([r.prompt_tokens for r in rows], [r.completion_tokens for r in rows])
    rows = [replace(r, logprobs=s.logprobs.tolist(), toploc_proofs=build_proofs(s.hidden_states))
            for r, s in zip(rows, scored, strict=True)]
    return replace(rf, completions=rows)


@pytest.mark.parametrize("change", ["int8", "layer_mlp_x1.1"])
def test_cheap_decode_with_an_honest_prefill(model, tok, engine, change):
    bad_model = quantize_weights(model, 8) if change == "int8" else scale_layer_mlp(model, 1.1)
    rules = bench.make_rules(64, 8, 4)
    rf = _cheap_decode_honest_prefill(bad_model, model, tok, rules)
    tight = _judge(engine, tok, rf, rules, TIGHT)
    assert _hard(tight, Check.SAMPLING), tight.reason
    assert not _hard(tight, Check.TOPLOC) and not _hard(tight, Check.LOGPROBS)
    # any-hardware admits bfloat16 workers, whose own flips are as many: bounded, not caught
    loose = _judge(engine, tok, rf, rules, LOOSE)
    assert loose.stats["inexact_tokens"] / loose.stats["tokens"] < 0.005


@pytest.mark.parametrize("change", ["int8", "layer_mlp_x1.1"])
def test_weight_cheats_in_small_files_are_pooled(model, tok, engine, change):
    """13 chunks (no pooled test before) and 1 chunk: the float32 profile rejects both cheats
    at either size; any-hardware now pools 13 chunks against thresholds widened by
    sqrt(16 / 13) and rejects one layer x1.1 there."""
    bad_model = quantize_weights(model, 8) if change == "int8" else scale_layer_mlp(model, 1.1)
    worker = CPUEngine(bad_model, tok, EngineConfig(num_threads=1))
    for rows in (13, 1):
        rules = bench.make_rules(32, rows, 1, ignore_eos=True)
        rf = bench.make_file(worker, tok, rules, 0)
        d = _judge(engine, tok, rf, rules, TIGHT)
        assert d.stats["chunks"] == rows and _hard(d, Check.TOPLOC), d.reason
    rules = bench.make_rules(32, 13, 1, ignore_eos=True)
    loose = _judge(engine, tok, bench.make_file(worker, tok, rules, 0), rules, LOOSE)
    assert loose.stats["pooled_limits"]["mant_err_mean"] == pytest.approx(0.78 * (16 / 13) ** 0.5)
    assert _hard(loose, Check.TOPLOC) == (change == "layer_mlp_x1.1"), loose.reason
