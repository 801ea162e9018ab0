"""Detection matrix on a real (tiny, random) Qwen2, judged by the validator's own replay
(`meshrl.validator.replay.replay_files` into the pool's `Decision`s, the code a pool runs):
honest recomputation in every honest validator mode is always accepted, cheats are always
hard-invalidated, with the calibrated default thresholds, the paper's, and thresholds
calibrated on held-out honest rollouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toploc_scenario import (
    GROUP,
    MAX_NEW,
    groups,
    judge,
    one_thread,
    recompute,
    run_worker,
    spec_of,
)

from meshrl.pool import Check, VerdictKind
from meshrl.toploc import Thresholds, build_proofs, calibrate_thresholds, verify_proofs
from meshrl.toploc.modes import HONEST_MODES
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.toploc.recompute import mode_backend
from meshrl.wire.rollout_file import Completion as Row

pytestmark = pytest.mark.slow
N_CALIB = 16  # prompts [0, 16) calibrate, [16, 48) evaluate
CHEAT_NEW = 64  # cheat rollouts: 4 completions of 64 tokens (8 chunks)


@pytest.fixture(scope="module")
def calibrated(scenario, honest_rows) -> Thresholds:
    rollouts = []
    with one_thread():
        for mode in HONEST_MODES:
            rows = honest_rows[:N_CALIB]
            rec = recompute(scenario.model, rows, mode)
            for group in groups(list(zip(rows, rec, strict=True))):
                rollouts.append([x for r, s in group
                                 for x in verify_proofs(s.hidden_states, r.toploc_proofs)])
    # this suite's cheat rollouts are short (4 x 64 tokens): pool from 4 chunks on
    return calibrate_thresholds(rollouts, fpr=1e-3, min_pooled_chunks=4)


def test_calibrated_thresholds_are_tighter(calibrated):
    default = Thresholds.paper()
    assert calibrated.max_exp_mismatches <= default.max_exp_mismatches
    assert calibrated.max_mant_err_mean < default.max_mant_err_mean
    assert calibrated.max_pooled_mant_err_mean is not None


@pytest.mark.parametrize("mode", HONEST_MODES)
def test_honest_recomputation_is_accepted(scenario, honest_rows, calibrated, mode):
    rows = honest_rows[N_CALIB:]
    n_chunks = sum(len(r.toploc_proofs) for r in rows)
    assert n_chunks * len(HONEST_MODES) >= 1000  # over all modes
    backend = mode_backend(scenario.model, mode)
    spec = spec_of(scenario.params, scenario.tok.eos_token_id)
    for thresholds in (Thresholds(), calibrated):
        decisions = judge(backend, rows, spec, thresholds)
        assert len(decisions) == len(rows) // GROUP
        assert all(d.accepted for d in decisions), [d.reason for d in decisions]
        assert sum(d.stats["chunks"] for d in decisions) == n_chunks


CHEAT_PROMPTS = slice(16, 24)  # 8 prompts, two rollouts of four


def _judge_cheat(scenario, rows, thresholds, max_new=CHEAT_NEW):
    """Decisions on a cheat's two rollouts, replayed by an honest bf16 validator, by the rules
    the cheat claims to follow (`max_new` tokens per completion)."""
    spec = spec_of(scenario.params, scenario.tok.eos_token_id, max_new)
    decisions = judge(mode_backend(scenario.model, "bf16-batch8"), rows, spec, thresholds)
    assert len(decisions) == 2
    return decisions


def _cheat_rows(scenario, kind: str) -> list[Row]:
    prompts = scenario.prompts[CHEAT_PROMPTS]
    seq_ids = list(range(CHEAT_PROMPTS.start, CHEAT_PROMPTS.stop))
    model = scenario.model
    if kind == "other-model":
        from meshrl.model import build_model

        other = build_model("qwen2-tiny", scenario.tok.vocab_size, seed=1, dtype=torch.bfloat16)
        return run_worker(other, scenario, prompts, CHEAT_NEW, seq_ids)
    if kind == "int4":
        return run_worker(quantize_weights(model, 4), scenario, prompts, CHEAT_NEW, seq_ids)
    if kind == "int8":
        return run_worker(quantize_weights(model, 8), scenario, prompts, CHEAT_NEW, seq_ids)
    if kind == "layer-x1.1":
        return run_worker(scale_layer_mlp(model, 1.1), scenario, prompts, CHEAT_NEW, seq_ids)
    if kind == "altered-prompt":
        altered = [[*p[:-2], (p[-2] + 1 - 4) % 90 + 4, p[-1]] for p in prompts]
        rows = run_worker(model, scenario, altered, CHEAT_NEW, seq_ids)
        for r, p in zip(rows, prompts, strict=True):
            r.prompt_tokens = p  # claims the original prompt
        return rows
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["other-model", "int4", "altered-prompt", "int8", "layer-x1.1"])
def test_model_and_prompt_cheats_are_rejected(scenario, calibrated, kind):
    rows = _cheat_rows(scenario, kind)
    # the activation proofs alone catch it, not only the sampling replay
    for d in _judge_cheat(scenario, rows, calibrated):
        assert d.kind is VerdictKind.HARD_INVALID and Check.TOPLOC in d.checks, d.reason
    if kind in ("other-model", "int4"):  # blatant: caught even by the paper's thresholds
        for d in _judge_cheat(scenario, rows, Thresholds.paper()):
            assert d.kind is VerdictKind.HARD_INVALID and Check.TOPLOC in d.checks, d.reason
    if kind in ("int8", "layer-x1.1"):  # subtle: the paper's thresholds see nothing here
        for d in _judge_cheat(scenario, rows, Thresholds.paper()):
            assert Check.TOPLOC not in d.checks, d.reason


def test_tokens_the_sampler_did_not_pick_are_rejected(scenario, honest_rows, calibrated):
    """The cheat swaps tokens and rebuilds consistent proofs and log-probs from a prefill of its
    own sequence: TOPLOC and the log-prob check pass, the sampling replay does not."""
    rows = [dataclasses.replace(r) for r in honest_rows[16:24]]
    for i, r in enumerate(rows):
        j = 5 + 7 * i
        t = r.completion_tokens
        r.completion_tokens = [*t[:j], (t[j] + 17 - 4) % 90 + 4, *t[j + 1 :]]
    rec = recompute(scenario.model, rows, "bf16-batch8")
    for r, s in zip(rows, rec, strict=True):
        r.toploc_proofs = build_proofs(s.hidden_states)
        lp = torch.log_softmax(s.logits, -1).gather(-1, torch.tensor(r.completion_tokens)[:, None])
        r.logprobs = lp.squeeze(-1).tolist()
    for d in _judge_cheat(scenario, rows, calibrated, MAX_NEW):
        assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.SAMPLING,), d.reason
        assert "not the seeded sampler's pick" in d.reason


def test_truncated_completion_claimed_finished_is_rejected(scenario, honest_rows, calibrated):
    n = 70
    rows = [dataclasses.replace(r, completion_tokens=r.completion_tokens[:n],
                                logprobs=r.logprobs[:n], finish_reason="length",
                                toploc_proofs=[]) for r in honest_rows[16:24]]
    rec = recompute(scenario.model, rows, "bf16-batch8")
    for r, s in zip(rows, rec, strict=True):
        # consistent proofs for the truncated completion
        r.toploc_proofs = build_proofs(s.hidden_states)
    for d in _judge_cheat(scenario, rows, calibrated, MAX_NEW):
        assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.TERMINATION,), d.reason
        assert "claimed the length limit with 70 of 128 tokens" in d.reason
    eos = [dataclasses.replace(r, finish_reason="eos") for r in rows]
    for d in _judge_cheat(scenario, eos, calibrated, MAX_NEW):
        assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.TERMINATION,), d.reason
    assert n < MAX_NEW and GROUP == 4
