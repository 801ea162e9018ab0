"""Detection matrix on a real (tiny, random) Qwen2: honest recomputation always accepted,
cheats always rejected, with the paper's thresholds and with thresholds calibrated on held-out
honest rollouts."""

from __future__ import annotations

import pytest
import torch
from toploc_scenario import GROUP, MAX_NEW, groups, one_thread, recompute, run_worker

from meshrl.toploc import Thresholds, build_proofs, calibrate_thresholds, verify_proofs
from meshrl.toploc.modes import HONEST_MODES
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.toploc.validate import Claim, ValidatorConfig, validate_rollout

pytestmark = pytest.mark.slow
N_CALIB = 16  # prompts [0, 16) calibrate, [16, 48) evaluate


@pytest.fixture(scope="module")
def recomputed(scenario, honest_claims):
    with one_thread():
        return {mode: recompute(scenario.model, honest_claims, mode) for mode in HONEST_MODES}


@pytest.fixture(scope="module")
def calibrated(honest_claims, recomputed) -> Thresholds:
    rollouts = []
    for mode in HONEST_MODES:
        pairs = list(zip(honest_claims, recomputed[mode], strict=True))[:N_CALIB]
        for group in groups(pairs):
            rollouts.append([r for c, rec in group
                             for r in verify_proofs(rec.hidden_states, c.proofs)])
    # this suite's cheat rollouts are short (4 x 64 tokens): pool from 4 chunks on
    return calibrate_thresholds(rollouts, fpr=1e-3, min_pooled_chunks=4)


def _rollouts(claims, rec, scenario, thresholds):
    return [
        validate_rollout([c for c, _ in g], [r for _, r in g], scenario.params,
                         scenario.tok.eos_token_id, ValidatorConfig(thresholds=thresholds))
        for g in groups(list(zip(claims, rec, strict=True)))
    ]


def test_calibrated_thresholds_are_tighter(calibrated):
    default = Thresholds.paper()
    assert calibrated.max_exp_mismatches <= default.max_exp_mismatches
    assert calibrated.max_mant_err_mean < default.max_mant_err_mean
    assert calibrated.max_pooled_mant_err_mean is not None


@pytest.mark.parametrize("mode", HONEST_MODES)
def test_honest_recomputation_is_accepted(scenario, honest_claims, recomputed, calibrated, mode):
    claims, rec = honest_claims[N_CALIB:], recomputed[mode][N_CALIB:]
    n_chunks = sum(len(c.proofs) for c in claims)
    assert n_chunks * len(HONEST_MODES) >= 1000  # over all modes
    for thresholds in (Thresholds(), calibrated):
        reports = _rollouts(claims, rec, scenario, thresholds)
        assert all(r.accepted for r in reports), [r.reasons for r in reports if not r.accepted]
        assert sum(len(r.chunk_results) for r in reports) == n_chunks


def _validate_cheat(scenario, claims, calibrated, thresholds=None):
    rec = recompute(scenario.model, claims, "bf16-batch8")
    return _rollouts(claims, rec, scenario, thresholds or calibrated)


CHEAT_PROMPTS = slice(16, 24)  # 8 prompts, two rollouts of four


def _cheat_claims(scenario, kind: str) -> list[Claim]:
    prompts = scenario.prompts[CHEAT_PROMPTS]
    seq_ids = list(range(CHEAT_PROMPTS.start, CHEAT_PROMPTS.stop))
    model = scenario.model
    if kind == "other-model":
        from meshrl.model import build_model

        other = build_model("qwen2-tiny", scenario.tok.vocab_size, seed=1, dtype=torch.bfloat16)
        return run_worker(other, scenario, prompts, 64, seq_ids)
    if kind == "int4":
        return run_worker(quantize_weights(model, 4), scenario, prompts, 64, seq_ids)
    if kind == "int8":
        return run_worker(quantize_weights(model, 8), scenario, prompts, 64, seq_ids)
    if kind == "layer-x1.1":
        return run_worker(scale_layer_mlp(model, 1.1), scenario, prompts, 64, seq_ids)
    if kind == "altered-prompt":
        altered = [[*p[:-2], (p[-2] + 1 - 4) % 90 + 4, p[-1]] for p in prompts]
        claims = run_worker(model, scenario, altered, 64, seq_ids)
        for c, p in zip(claims, prompts, strict=True):
            c.prompt_ids = p  # claims the original prompt
        return claims
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["other-model", "int4", "altered-prompt", "int8", "layer-x1.1"])
def test_model_and_prompt_cheats_are_rejected(scenario, calibrated, kind):
    claims = _cheat_claims(scenario, kind)
    reports = _validate_cheat(scenario, claims, calibrated)
    assert len(reports) == 2 and not any(r.accepted for r in reports)
    # the activation proofs alone catch it, not only the sampling replay
    assert all(any(x.startswith("toploc") for x in r.reasons) for r in reports), [
        r.reasons for r in reports
    ]
    if kind in ("other-model", "int4"):  # blatant: caught even by the paper's thresholds
        default = _validate_cheat(scenario, claims, calibrated, Thresholds.paper())
        assert all(any(x.startswith("toploc") for x in r.reasons) for r in default)


def test_tokens_the_sampler_did_not_pick_are_rejected(scenario, honest_claims, calibrated):
    """The cheat swaps tokens and rebuilds consistent proofs from a prefill of its own sequence:
    TOPLOC passes, the sampling replay does not."""
    claims = [Claim(**vars(c)) for c in honest_claims[16:24]]
    for i, c in enumerate(claims):
        j = 5 + 7 * i
        c.token_ids = [*c.token_ids[:j], (c.token_ids[j] + 17 - 4) % 90 + 4, *c.token_ids[j + 1 :]]
    rec = recompute(scenario.model, claims, "bf16-batch8")
    for c, r in zip(claims, rec, strict=True):
        c.proofs = build_proofs(r.hidden_states)
        c.logprobs = torch.log_softmax(r.logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])
        c.logprobs = c.logprobs.squeeze(-1).tolist()
    reports = _validate_cheat(scenario, claims, calibrated)
    assert not any(r.accepted for r in reports)
    assert all(all("toploc" not in x for x in r.reasons) for r in reports)
    assert all(any("seeded sampler" in x for x in r.reasons) for r in reports)


def test_truncated_completion_claimed_finished_is_rejected(scenario, honest_claims, calibrated):
    claims = []
    for c in honest_claims[16:24]:
        n = 70
        claims.append(Claim(c.prompt_ids, c.token_ids[:n], c.logprobs[:n], "length", c.seq_id,
                            c.policy_version, proofs=[*c.proofs[:2], c.proofs[2]]))
    rec = recompute(scenario.model, claims, "bf16-batch8")
    for c, r in zip(claims, rec, strict=True):
        c.proofs = build_proofs(r.hidden_states)  # consistent proofs for the truncated completion
    reports = _rollouts(claims, rec, scenario, calibrated)
    assert not any(r.accepted for r in reports)
    assert all(any("termination" in x for x in r.reasons) for r in reports)
    eos = [Claim(**{**vars(c), "finish_reason": "eos"}) for c in claims]
    assert not any(r.accepted for r in _rollouts(eos, rec, scenario, calibrated))
    assert MAX_NEW > 70 and GROUP == 4
