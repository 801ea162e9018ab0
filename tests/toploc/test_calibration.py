"""The default thresholds on a subset of the calibration (full counts: benchmarks/README.md).

Honest completions from meshrl's decoder and from `transformers` `generate`, checked by
validators at other batch sizes, padding sides, attention kernels and precisions, must pass the
default `Thresholds()` with every statistic at most 70% of its threshold; the three subtle
changes of the issue must be rejected in every rollout, by the TOPLOC tests alone.
"""

from __future__ import annotations

import pytest
import torch
from toploc_scenario import make_prompts

from meshrl.model import CharTokenizer, build_model
from meshrl.toploc import (
    HEADROOM,
    Thresholds,
    build_proofs,
    threshold_ratios,
    verdict,
    verify_proofs,
)
from meshrl.toploc.honest import HONEST_VALIDATORS, HONEST_WORKERS, recompute_with, work_with
from meshrl.toploc.perturb import noise_weights, quantize_weights, scale_layer_mlp

pytestmark = pytest.mark.slow
MAX_NEW, SEED, GROUP = 128, 1234, 4
WORKERS = ("meshrl-b16", "hf-b1")
VALIDATORS = ("b1", "b64-left", "b16-left-pad200-eager", "fp32-b8")


def _setups(setups, names):
    return [s for s in setups if s.name in names]


@pytest.fixture(scope="module")
def calib_model():
    tok = CharTokenizer()
    model = build_model("qwen2-4l-256", tok.vocab_size, seed=0, dtype=torch.bfloat16)
    return model, make_prompts(8, 1, tok.vocab_size), make_prompts(8, 2, tok.vocab_size)


def _rollouts(model, worker_model, worker, validators, prompts):
    work = work_with(worker_model, worker, prompts, MAX_NEW, SEED)
    proofs = [build_proofs(h) for _, h in work]
    out = []
    for v in validators:
        hidden = recompute_with(model, v, prompts, [t for t, _ in work])
        per = [verify_proofs(h, p) for h, p in zip(hidden, proofs, strict=True)]
        out += [[r for p in per[i : i + GROUP] for r in p] for i in range(0, len(per), GROUP)]
    return out


def test_honest_variation_passes_with_headroom(calib_model):
    model, prompts, _ = calib_model
    th = Thresholds()
    rollouts = []
    for w in _setups(HONEST_WORKERS, WORKERS):
        rollouts += _rollouts(model, model, w, _setups(HONEST_VALIDATORS, VALIDATORS), prompts)
    chunks = sum(len(ro) for ro in rollouts)
    assert chunks == len(WORKERS) * len(VALIDATORS) * 8 * MAX_NEW // 32
    assert all(len(ro) >= th.min_pooled_chunks for ro in rollouts)  # pooled tests apply
    rejected = [verdict(ro, th).reasons for ro in rollouts if not verdict(ro, th).accepted]
    assert not rejected
    ratios = threshold_ratios(rollouts, th)
    assert len(ratios) == 7 and max(ratios.values()) <= HEADROOM, ratios


@pytest.mark.parametrize("change", ["int8", "layer_mlp_x1.1", "noise_0.01"])
def test_subtle_changes_are_rejected(calib_model, change):
    model, _, prompts = calib_model
    bad = {"int8": lambda m: quantize_weights(m, 8),
           "layer_mlp_x1.1": lambda m: scale_layer_mlp(m, 1.1),
           "noise_0.01": lambda m: noise_weights(m, 0.01)}[change](model)
    (worker,) = _setups(HONEST_WORKERS, ("meshrl-b16",))
    rollouts = _rollouts(model, bad, worker, _setups(HONEST_VALIDATORS, ("b1", "fp32-b8")),
                         prompts)
    assert len(rollouts) == 4
    verdicts = [verdict(ro) for ro in rollouts]
    assert not any(v.accepted for v in verdicts), [v.stats for v in verdicts]
    # the paper's thresholds miss them: the pooled tests do the work
    assert all(verdict(ro, Thresholds.paper()).accepted for ro in rollouts)
