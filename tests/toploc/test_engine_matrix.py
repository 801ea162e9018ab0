"""Detection matrix with the inference engine as the worker and as a validator.

The engine computes in float32 and returns bf16 hidden states; validators recompute with the
engine's `score` (other batch size and thread count) or with a plain HF prefill in bf16 / fp32.
Thresholds are calibrated on honest rollouts of the first prompts and evaluated on the rest:
once over every validator mode, and once for fp32 validators only (a validator calibrates for
its own setup; a bf16 validator of fp32 work sees more honest noise than an fp32 one)."""

from __future__ import annotations

import pytest
from toploc_scenario import groups, make_prompts

from meshrl.inference import SamplingParams
from meshrl.inference.engine import CPUEngine, EngineConfig
from meshrl.toploc import Thresholds, build_proofs, calibrate_thresholds, verify_proofs
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.toploc.recompute import recompute_mode
from meshrl.toploc.validate import Claim, ValidatorConfig, validate_rollout

pytestmark = pytest.mark.slow
MAX_NEW, SEED, N_CALIB = 96, 77, 8
PARAMS = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, seed=SEED,
                        return_hidden_states=True)
MODES = ("engine-batch64", "engine-batch1-threads1", "hf-bf16-batch8", "fp32-eager-leftpad")
FP32_MODES = ("engine-batch64", "engine-batch1-threads1", "fp32-eager-leftpad")


@pytest.fixture(scope="module")
def setup(scenario):
    tok, model = scenario.tok, scenario.model  # bf16 weights; the engine runs them in fp32
    prompts = make_prompts(24, seed=5, vocab=tok.vocab_size)
    return model, tok, prompts


def _engine_claims(model, tok, prompts, seq_ids) -> list[Claim]:
    engine = CPUEngine(model, tok, EngineConfig())
    comps = engine.generate(prompts, PARAMS, seq_ids=seq_ids)
    return [Claim.of(c, build_proofs(c.hidden_states)) for c in comps]


def _recompute(model, tok, claims, mode):
    ps, cs = [c.prompt_ids for c in claims], [c.token_ids for c in claims]
    if mode.startswith("engine"):
        cfg = EngineConfig(max_batch_size=1, num_threads=1) if "batch1" in mode else \
            EngineConfig(max_batch_size=64)
        return CPUEngine(model, tok, cfg).score(ps, cs, return_hidden_states=True,
                                                return_logits=True)
    return recompute_mode(model, ps, cs, "bf16-batch8" if mode == "hf-bf16-batch8" else mode)


@pytest.fixture(scope="module")
def honest(setup):
    model, tok, prompts = setup
    claims = _engine_claims(model, tok, prompts, list(range(len(prompts))))
    return claims, {m: _recompute(model, tok, claims, m) for m in MODES}


def _calibrate(honest, modes) -> Thresholds:
    claims, rec = honest
    rollouts = []
    for m in modes:
        for g in groups(list(zip(claims, rec[m], strict=True))[:N_CALIB]):
            rollouts.append([r for c, rec_ in g for r in verify_proofs(rec_.hidden_states,
                                                                       c.proofs)])
    return calibrate_thresholds(rollouts, fpr=1e-3)


@pytest.fixture(scope="module")
def calibrated(honest) -> dict[str, Thresholds]:
    return {"all": _calibrate(honest, MODES), "fp32": _calibrate(honest, FP32_MODES)}


def _reports(claims, rec, tok, th):
    return [validate_rollout([c for c, _ in g], [r for _, r in g], PARAMS, tok.eos_token_id,
                             ValidatorConfig(thresholds=th))
            for g in groups(list(zip(claims, rec, strict=True)))]


def test_engine_completions_end_correctly(honest):
    claims, _ = honest
    assert {c.finish_reason for c in claims} <= {"eos", "length"}
    assert sum(len(c.proofs) for c in claims) >= 32


@pytest.mark.parametrize("mode", MODES)
def test_engine_honest_accepted(setup, honest, calibrated, mode):
    _, tok, _ = setup
    claims, rec = honest
    sets = [Thresholds(), calibrated["all"]] + ([calibrated["fp32"]] if mode in FP32_MODES else [])
    for th in sets:
        reports = _reports(claims[N_CALIB:], rec[mode][N_CALIB:], tok, th)
        assert all(r.accepted for r in reports), [r.reasons for r in reports if not r.accepted]


@pytest.mark.parametrize("kind", ["int4", "int8", "layer-x1.1", "altered-prompt"])
def test_engine_cheats_rejected(setup, calibrated, kind):
    model, tok, prompts = setup
    ps, seq_ids = prompts[N_CALIB : N_CALIB + 8], list(range(N_CALIB, N_CALIB + 8))
    if kind == "altered-prompt":
        altered = [[*p[:-1], (p[-1] + 1 - 4) % 90 + 4] for p in ps]
        claims = _engine_claims(model, tok, altered, seq_ids)
        for c, p in zip(claims, ps, strict=True):
            c.prompt_ids = p
    else:
        bad = {"int4": lambda m: quantize_weights(m, 4), "int8": lambda m: quantize_weights(m, 8),
               "layer-x1.1": lambda m: scale_layer_mlp(m, 1.1)}[kind](model)
        claims = _engine_claims(bad, tok, ps, seq_ids)
    rec = _recompute(model, tok, claims, "engine-batch64")
    reports = _reports(claims, rec, tok, calibrated["fp32"])
    assert reports and not any(r.accepted for r in reports)
    assert all(any(x.startswith("toploc") for x in r.reasons) for r in reports)
