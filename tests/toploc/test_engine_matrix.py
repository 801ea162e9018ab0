"""Detection matrix with the inference engine as the worker and as a validator.

The engine computes in float32 and returns bf16 hidden states; validators recompute with the
engine's `score` (other batch size and thread count) or with a plain HF prefill in bf16 / fp32.
Thresholds are calibrated on honest rollouts of the first prompts and evaluated on the rest:
once over every validator mode, and once for fp32 validators only (a validator calibrates for
its own setup; a bf16 validator of fp32 work sees more honest noise than an fp32 one). Every
rollout is judged by the validator's own replay (`meshrl.validator.replay.replay_files`)."""

from __future__ import annotations

import pytest
from toploc_scenario import groups, judge, make_prompts, spec_of, to_rows

from meshrl.inference import InferenceBackend, SamplingParams
from meshrl.inference.engine import CPUEngine, EngineConfig
from meshrl.pool import Check, VerdictKind
from meshrl.toploc import Thresholds, calibrate_thresholds, verify_proofs
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.toploc.recompute import mode_backend
from meshrl.wire.rollout_file import Completion as Row

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


def _engine_rows(model, tok, prompts, seq_ids) -> list[Row]:
    engine = CPUEngine(model, tok, EngineConfig())
    return to_rows(engine.generate(prompts, PARAMS, seq_ids=seq_ids))


def _backend(model, tok, mode) -> InferenceBackend:
    """The validator's engine in `mode`: meshrl's engine, or the reference backend (bf16, fp32)."""
    if mode.startswith("engine"):
        cfg = EngineConfig(max_batch_size=1, num_threads=1) if "batch1" in mode else \
            EngineConfig(max_batch_size=64)
        return CPUEngine(model, tok, cfg)
    return mode_backend(model, "bf16-batch8" if mode == "hf-bf16-batch8" else mode)


@pytest.fixture(scope="module")
def honest(setup) -> list[Row]:
    model, tok, prompts = setup
    return _engine_rows(model, tok, prompts, list(range(len(prompts))))


def _calibrate(setup, rows, modes) -> Thresholds:
    model, tok, _ = setup
    rows = rows[:N_CALIB]
    rollouts = []
    for m in modes:
        rec = _backend(model, tok, m).score([r.prompt_tokens for r in rows],
                                            [r.completion_tokens for r in rows])
        for g in groups(list(zip(rows, rec, strict=True))):
            rollouts.append([x for r, s in g
                             for x in verify_proofs(s.hidden_states, r.toploc_proofs)])
    return calibrate_thresholds(rollouts, fpr=1e-3)


@pytest.fixture(scope="module")
def calibrated(setup, honest) -> dict[str, Thresholds]:
    return {"all": _calibrate(setup, honest, MODES), "fp32": _calibrate(setup, honest, FP32_MODES)}


def _judge(model, tok, rows, mode, th):
    return judge(_backend(model, tok, mode), rows, spec_of(PARAMS, tok.eos_token_id), th)


def test_engine_completions_end_correctly(honest):
    assert {r.finish_reason for r in honest} <= {"eos", "length"}
    assert sum(len(r.toploc_proofs) for r in honest) >= 32


@pytest.mark.parametrize("mode", MODES)
def test_engine_honest_accepted(setup, honest, calibrated, mode):
    model, tok, _ = setup
    sets = [Thresholds(), calibrated["all"]] + ([calibrated["fp32"]] if mode in FP32_MODES else [])
    for th in sets:
        decisions = _judge(model, tok, honest[N_CALIB:], mode, th)
        assert len(decisions) == (len(honest) - N_CALIB) // 4
        assert all(d.accepted for d in decisions), [d.reason for d in decisions]


@pytest.mark.parametrize("kind", ["int4", "int8", "layer-x1.1", "altered-prompt"])
def test_engine_cheats_rejected(setup, calibrated, kind):
    model, tok, prompts = setup
    ps, seq_ids = prompts[N_CALIB : N_CALIB + 8], list(range(N_CALIB, N_CALIB + 8))
    if kind == "altered-prompt":
        altered = [[*p[:-1], (p[-1] + 1 - 4) % 90 + 4] for p in ps]
        rows = _engine_rows(model, tok, altered, seq_ids)
        for r, p in zip(rows, ps, strict=True):
            r.prompt_tokens = p
    else:
        bad = {"int4": lambda m: quantize_weights(m, 4), "int8": lambda m: quantize_weights(m, 8),
               "layer-x1.1": lambda m: scale_layer_mlp(m, 1.1)}[kind](model)
        rows = _engine_rows(bad, tok, ps, seq_ids)
    decisions = _judge(model, tok, rows, "engine-batch64", calibrated["fp32"])
    assert len(decisions) == 2
    for d in decisions:  # the activation proofs catch it, not only the sampling replay
        assert d.kind is VerdictKind.HARD_INVALID and Check.TOPLOC in d.checks, d.reason
