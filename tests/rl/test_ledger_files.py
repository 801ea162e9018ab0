"""The trainer's side of an accepted file: a real worker file (engine, rewards, proofs) read
back through its Parquet bytes and split into the trainer's groups."""

from __future__ import annotations

import hashlib

import pytest
import torch

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model
from meshrl.pool import Assignment, PoolRules
from meshrl.rl.ledger_files import UnusableFile, file_groups
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.wire import RolloutFileError
from meshrl.wire.models import FileStatus, LedgerEntry
from meshrl.wire.rollout_file import rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts

NODE, PROVIDER = "0x" + "ab" * 20, "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+")])
RULES = PoolRules(pool_id=1, seed=5, prompts_per_file=3, group_size=4, task=TASKS,
                  sampling={"max_new_tokens": 6, "temperature": 1.0})
BUILT = TASKS.build()


@pytest.fixture(scope="module")
def worker_file():
    tok = CharTokenizer()
    engine = CPUEngine(build_model("qwen2-tiny", tok.vocab_size, seed=3), tok,
                       EngineConfig(num_threads=1))
    a = Assignment(RULES, NODE, counter=2, policy_version=0)
    rf = generate_rollouts(engine, tok, a, BUILT, PROVIDER)
    data = rollout_file_bytes(rf)
    entry = LedgerEntry(seq=1, sha256=hashlib.sha256(data).hexdigest(), node=NODE,
                        provider=PROVIDER, policy_version=rf.header.policy_version,
                        work_units=rf.header.work_units, size=len(data),
                        status=FileStatus.ACCEPTED, download="/files/x")
    return tok, a, rf, data, entry


def test_groups_follow_the_worker_rows(worker_file) -> None:
    tok, a, rf, data, entry = worker_file
    fg = file_groups(entry, data, tok, RULES, BUILT)
    b = fg.rows
    assert fg.groups == 3 and len(b.completion_ids) == 12
    assert (b.index, b.version) == (entry.policy_version, entry.policy_version)
    assert b.problems == a.problems(BUILT)
    assert b.completion_ids == [r.completion_tokens for r in rf.completions]
    assert b.rewards.tolist() == torch.tensor(
        [[r.reward for r in rf.completions[k * 4:(k + 1) * 4]] for k in range(3)]).tolist()
    # no length term in this task mix: the verifier's score is the file's reward
    assert torch.equal(b.task_rewards, b.rewards)
    assert b.truncated == sum(r.finish_reason == "length" for r in rf.completions)
    assert b.loss_masks == [[True] * len(r.completion_tokens) for r in rf.completions]


def test_held_out_prompts_are_left_out(worker_file) -> None:
    tok, a, _, data, entry = worker_file
    held = frozenset({a.problems(BUILT)[1].prompt})
    fg = file_groups(entry, data, tok, RULES, BUILT, exclude=held)
    assert fg.groups == 2 and fg.excluded == 1 and len(fg.rows.prompt_ids) == 8
    assert held.isdisjoint(p.prompt for p in fg.rows.problems)


def test_a_steps_files_join_into_one_batch(worker_file) -> None:
    """The trainer's batch is its files' groups in the order taken (`RolloutBatch.concat`),
    of the oldest file's version; a part without loss masks counts every token the model's."""
    from dataclasses import replace

    from meshrl.rl.rollouts import RolloutBatch

    tok, a, _, data, entry = worker_file
    whole = file_groups(entry, data, tok, RULES, BUILT).rows
    part = file_groups(entry, data, tok, RULES, BUILT,
                       exclude=frozenset({a.problems(BUILT)[0].prompt})).rows
    newer = replace(part, version=part.version + 1, loss_masks=None)
    b = RolloutBatch.concat([newer, whole], index=7, gen_seconds=1.5)
    assert (b.index, b.version, b.groups, b.gen_seconds) == (7, whole.version, 5, 1.5)
    assert b.problems == part.problems + whole.problems
    assert b.completion_ids == part.completion_ids + whole.completion_ids
    assert torch.equal(b.rewards, torch.cat([part.rewards, whole.rewards]))
    assert b.truncated == part.truncated + whole.truncated
    assert b.loss_masks == [[True] * len(c) for c in part.completion_ids] + whole.loss_masks


def test_unusable_files_are_refused(worker_file) -> None:
    tok, _, _, data, entry = worker_file
    other_shape = RULES.model_copy(update={"group_size": 2})  # 6 rows per file, not 12
    with pytest.raises(RolloutFileError, match="12 rows > limit 6"):  # refused unread
        file_groups(entry, data, tok, other_shape, BUILT)
    with pytest.raises(UnusableFile, match="hash"):
        file_groups(entry, data + b"x", tok, RULES, BUILT)
    other = entry.model_copy(update={"policy_version": entry.policy_version + 1})
    with pytest.raises(UnusableFile, match="differs"):
        file_groups(other, data, tok, RULES, BUILT)


def test_the_header_cannot_steer_the_trainer(worker_file) -> None:
    """Problems come from the pool's rules, never from what the worker wrote in the header: a
    header naming another task or seed changes nothing the trainer reads."""
    from meshrl.wire.rollout_file import read_rollout_file

    tok, a, rf, _, entry = worker_file
    forged = read_rollout_file(rollout_file_bytes(rf))
    forged.header = forged.header.model_copy(update={
        "rules_sha256": "00" * 32, "sampling_seed": 99})
    data = rollout_file_bytes(forged)
    entry = entry.model_copy(update={"sha256": hashlib.sha256(data).hexdigest()})
    fg = file_groups(entry, data, tok, RULES, BUILT)
    assert [p.prompt for p in fg.rows.problems] == [p.prompt for p in a.problems(BUILT)]


def _with_logprob(rf, entry, value: float):
    from meshrl.wire.rollout_file import read_rollout_file

    forged = read_rollout_file(rollout_file_bytes(rf))
    forged.completions[5].logprobs[0] = value
    data = rollout_file_bytes(forged)
    return data, entry.model_copy(update={"sha256": hashlib.sha256(data).hexdigest()})


def test_a_logprob_below_the_honest_floor_is_refused(worker_file) -> None:
    """Issue #41: one row's -100 (on a row the validator did not replay) made the ratio
    exp(new + 100) and the next step NaN everywhere; the trainer refuses such a file whatever
    the validator said. The floor is the sampler's: -GUMBEL_SPAN - log V."""
    import math

    from meshrl.pool import GUMBEL_SPAN

    tok, _, rf, _, entry = worker_file
    floor = -GUMBEL_SPAN - math.log(tok.vocab_size)
    for bad in (-100.0, floor - 0.01, 0.01):
        data, e = _with_logprob(rf, entry, bad)
        with pytest.raises(UnusableFile, match="no honest sampler"):
            file_groups(e, data, tok, RULES, BUILT)
    data, e = _with_logprob(rf, entry, floor + 0.01)  # the least an honest sampler reports
    got = file_groups(e, data, tok, RULES, BUILT).rows.inference_logprobs[5][0]
    assert got == pytest.approx(floor + 0.01)
    # the policy's logits may be wider than the tokenizer's vocabulary: its floor is lower
    data, e = _with_logprob(rf, entry, floor - 0.01)
    assert file_groups(e, data, tok, RULES, BUILT, vocab_size=tok.vocab_size * 2).groups == 3


@pytest.mark.timeout(180)
def test_an_answer_that_hangs_its_scorer_costs_the_trainer_nothing() -> None:
    """Issue #41: reasoning-gym's countdown (sympy's `parse_expr`) never ends on this answer;
    the trainer once re-scored accepted files (through the killable child, 0 at the deadline).
    Issue #44: it no longer runs the scorer at all: its accuracy is the task part of the
    rewards the validator recomputed, so the row scores its reward (0) at once."""
    import time

    from meshrl.tasks import GymConfig
    from meshrl.wire.rollout_file import read_rollout_file

    hang, deadline = "<answer>9**9**9**9</answer>", 2.0
    tasks = TasksConfig(mix=[GymConfig(dataset="countdown", timeout_s=deadline,
                                       config={"min_numbers": 2, "max_numbers": 2})])
    rules = PoolRules(pool_id=1, seed=5, prompts_per_file=1, group_size=2, task=tasks,
                      sampling={"max_new_tokens": 28, "temperature": 1.0})
    built = tasks.build()
    tok = CharTokenizer()  # a countdown prompt is ~355 characters: 512 positions
    engine = CPUEngine(build_model("qwen2-tiny", tok.vocab_size, seed=3,
                                   max_position_embeddings=512), tok,
                       EngineConfig(num_threads=1))
    rf = generate_rollouts(engine, tok, Assignment(rules, NODE, 0, 0), built, PROVIDER)
    forged = read_rollout_file(rollout_file_bytes(rf))
    row = forged.completions[1]  # the last row: no fresh child is timed after it
    row.completion_tokens = tok.encode(hang.rjust(len(row.completion_tokens), "x"))
    row.logprobs = [-1.0] * len(row.completion_tokens)
    row.reward = 0.0
    data = rollout_file_bytes(forged)

    def entry(data: bytes) -> LedgerEntry:
        return LedgerEntry(seq=1, sha256=hashlib.sha256(data).hexdigest(), node=NODE,
                           provider=PROVIDER, policy_version=0,
                           work_units=forged.header.work_units, size=len(data),
                           status=FileStatus.ACCEPTED, download="/files/x")
    honest = rollout_file_bytes(rf)
    file_groups(entry(honest), honest, tok, rules, built)  # child up, task built
    t0 = time.monotonic()
    fg = file_groups(entry(data), data, tok, rules, built)
    took = time.monotonic() - t0
    assert fg.rows.task_rewards[0][1] == 0.0 and took < deadline / 2, took
