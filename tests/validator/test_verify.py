"""The validator's checks on real worker batches: honest files pass with their numbers, and each
in-process cheat is caught by the check that names it, as a hard finding. The validator judges
by the "meshrl-cpu-engine" proof profile (every worker here runs the CPU engine): the default
"any-hardware" one pools only files of 16 chunks or more, and these have 8."""

from __future__ import annotations

import helpers
import pytest
from helpers import cheat_file, claim, honest_file, rules

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.pool import Check, VerdictKind
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file, verify_files

ENGINE = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))


def test_honest_file_is_accepted_with_numbers(engine, tok):
    r = rules(max_new=16)
    b = honest_file(engine, tok, r)
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.accepted and d.kind is VerdictKind.ACCEPT and d.checks == (), d.reason
    assert d.stats["rows"] == 8
    assert d.stats["tokens"] == sum(len(x.completion_tokens) for x in b.completions)
    assert d.stats["max_sampling_margin"] <= ReplayConfig().sampling_tolerance
    assert d.stats["max_logprob_diff"] < 1e-3
    assert d.stats["chunks"] == 8  # one proof per completion of <= 32 tokens


def test_validator_batch_size_and_threads_do_not_matter(model, tok, engine):
    r = rules(max_new=24, prompts=3)
    items = [(b, claim(b)) for b in (honest_file(engine, tok, r, counter=c) for c in range(3))]
    other = CPUEngine(model, tok, EngineConfig(max_batch_size=5, num_threads=2))
    cfg = ENGINE.model_copy(update={"max_batch_rows": 7})
    decisions = verify_files(other, tok, items, r, r.task.build(), cfg)
    assert len(decisions) == 3
    for d in decisions:
        assert d.accepted, d.reason


@pytest.mark.parametrize(("mode", "check"), [
    ("other-model", Check.TOPLOC),
    ("int8", Check.TOPLOC),
    ("scale-layer", Check.TOPLOC),
    ("cherry-pick", Check.PROMPTS),
    ("forge-rewards", Check.REWARDS),
    ("forge-sampling", Check.SAMPLING),
    ("truncate", Check.SAMPLING),
    ("inflate-units", Check.WORK_UNITS),
])
def test_each_generation_cheat_is_a_hard_finding(engine, model, tok, mode, check):
    r = rules(max_new=32, prompts=2, group=4)
    b = cheat_file(engine, model, tok, r, mode)
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.kind is VerdictKind.HARD_INVALID and not d.accepted
    assert check in d.checks, d.reason


@pytest.mark.parametrize("forgery", ["vocab", "negative", "int32-max", "past-context"])
def test_a_row_the_policy_cannot_score_sinks_only_its_own_file(engine, tok, forgery):
    """A completion token outside the vocabulary (or a sequence past the context) used to make
    the shared prefill raise: the whole batch came back as a validator error, the honest file
    beside it was soft-invalidated after the retries and the cheater never slashed. Checked per
    file before the batch is formed, it is a hard finding of that file alone."""
    r = rules(max_new=8)
    honest = honest_file(engine, tok, r)
    bad = honest_file(engine, tok, r, counter=1)
    row = bad.completions[0]
    if forgery == "past-context":
        extra = engine.max_seq_len - len(row.prompt_tokens) - len(row.completion_tokens) + 1
        row.completion_tokens = row.completion_tokens + [row.completion_tokens[0]] * extra
        row.logprobs = row.logprobs + [row.logprobs[0]] * extra
    else:
        row.completion_tokens[0] = {"vocab": engine.vocab_size, "negative": -1,
                                    "int32-max": 2**31 - 1}[forgery]
    decisions = verify_files(engine, tok, [(honest, claim(honest)), (bad, claim(bad))], r,
                             r.task.build(), ENGINE)
    assert decisions[0].accepted, decisions[0].reason
    assert decisions[1].kind is VerdictKind.HARD_INVALID
    assert decisions[1].checks == (Check.TOKENS,), decisions[1].reason


@pytest.mark.parametrize("field, value", [("sample_index", 7), ("prompt_id", "9/9/9")])
def test_a_row_whose_identity_is_not_the_assignments_is_hard(engine, tok, field, value):
    """`sample_index` and `prompt_id` used to be checked by nobody: a file with either forged
    was accepted. Every row's identity is its assignment's (seq_id = row, sample_index =
    row % group_size, prompt_id = step/counter/prompt)."""
    r = rules(max_new=8)
    b = honest_file(engine, tok, r)
    setattr(b.completions[0], field, value)
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.SEQ_IDS,), d.reason


def test_forging_one_tasks_rows_of_a_mix_is_caught_on_that_task(engine, model, tok, caplog):
    """`forge_task`: a cheater forges the rewards of one task's rows of a mix only; the rows of
    the other task keep their honest rewards, and the file is hard-invalidated on rewards. The
    cheater's log counts the rows it forged (the run's report tells its forged files by it)."""
    import logging

    from meshrl.pool import prompt_of_row
    from meshrl.tasks import TasksConfig

    mix = TasksConfig.model_validate({"mix": [{"type": "arithmetic", "digits": 1},
                                              {"type": "reverse"}]})
    r = rules(max_new=8, prompts=6, group=2).model_copy(update={"task": mix})
    tasks = [p.task for p in helpers.assignment(r).problems(r.task.build())]
    assert set(tasks) == {"arithmetic", "reverse"}  # the file holds rows of both
    honest = honest_file(engine, tok, r)
    for forged in ("arithmetic", "reverse"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="meshrl.worker"):
            b = cheat_file(engine, model, tok, r, "forge-rewards", forge_task=forged)
        for i, (h, c) in enumerate(zip(honest.completions, b.completions, strict=True)):
            want = 1.0 if tasks[prompt_of_row(i, 2)] == forged else h.reward
            assert c.reward == max(h.reward, want), (forged, i)
        changed = sum(h.reward != c.reward
                      for h, c in zip(honest.completions, b.completions, strict=True))
        said = [rec.fields for rec in caplog.records if rec.getMessage() == "rewards forged"]
        assert changed > 0 and said == [{"t": said[0]["t"], "version": b.header.policy_version,
                                         "counter": 0, "rows": changed}], said
        d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
        assert d.kind is VerdictKind.HARD_INVALID and Check.REWARDS in d.checks, d.reason
