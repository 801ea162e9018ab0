"""The model-free checks and the verdict policy, by hand-checked values."""

import hashlib
import random

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import claim, honest_file, rules

from meshrl.pool import (
    Check,
    Finding,
    PoolRules,
    Severity,
    VerdictKind,
    decide,
    file_limits,
    give_up,
)
from meshrl.validator.checks import (
    check_header_rules,
    check_node,
    check_prompts,
    check_rewards,
    check_sampling_seed,
    check_sha256,
    check_termination,
    check_work_units,
    row_termination,
)
from meshrl.validator.policy import RetryConfig, backoff_delay
from meshrl.validator.state import Job, ValidatorState
from meshrl.validator.verify import verify_file
from meshrl.wire.rollout_file import read_rollout_file
from wire.hostile import columns, header_bytes, write_parquet

A, B = "0x" + "1" * 40, "0x" + "2" * 40


def test_sha256_is_soft_and_names_both_hashes():
    data = b"rollouts"
    good = hashlib.sha256(data).hexdigest()
    assert check_sha256(data, good) is None and check_sha256(data, "0x" + good.upper()) is None
    f = check_sha256(data + b"!", good)
    assert f.severity is Severity.SOFT and f.check is Check.SHA256
    assert f.numbers["chain"] == good and f.numbers["bytes"] == 9


def test_node_and_units():
    assert check_node(A, B, A.upper().replace("0X", "0x"), B) is None
    assert check_node(A, B, B, B).severity is Severity.HARD
    assert check_work_units(30, 30, [5, 5], [10, 10]) is None
    f = check_work_units(60, 60, [5, 5], [10, 10])
    assert f.severity is Severity.HARD and f.numbers == {"chain": 60, "file": 60, "tokens": 30}
    assert check_work_units(30, 31, [5, 5], [10, 10]).numbers["chain"] == 31


def test_prompts_rows_and_groups():
    rows = [[1, 2], [1, 2], [3], [3]]  # Assignment.prompt_rows: prompt r // group_size
    assert check_prompts([[1, 2], [1, 2], [3], [3]], rows) is None
    f = check_prompts([[1, 2], [1, 2], [3], [4]], rows)
    assert f.numbers == {"bad_rows": 1, "first": 3} and f.check is Check.PROMPTS
    assert check_prompts([[1, 2], [3]], rows).numbers == {"rows": 2, "expected": 4}


def test_header_rules_are_the_published_ones():
    rules = PoolRules(pool_id=2, seed=7, task={"type": "arithmetic", "digits": 2})
    assert check_header_rules(2, rules.digest(), rules) is None
    other = rules.model_copy(update={"seed": 8})
    f = check_header_rules(3, other.digest(), rules)
    assert f.check is Check.RULES and f.severity is Severity.HARD
    assert f.reason == "the header's pool_id, rules_sha256 differ from the pool's published rules"
    digits = PoolRules(pool_id=2, seed=7, task={"type": "arithmetic", "digits": 3})
    assert check_header_rules(2, digits.digest(), rules).reason.startswith(
        "the header's rules_sha256 differ")


def test_sampling_seed_and_rewards():
    assert check_sampling_seed(5, 5) is None
    f = check_sampling_seed(5, 6)
    assert f.check is Check.SAMPLING_SEED and f.reason == "sampler seed 5 is not the assigned 6"
    assert check_rewards([1.0, 0.0], [1.0, 0.0]) is None
    f = check_rewards([1.0, 1.0, float("nan")], [1.0, 0.0, 0.0])
    assert f.numbers["bad_rows"] == 2 and "row 1: claims 1.0, recomputed 0.0" in f.reason


EOS, STOP = 2, 9


def test_termination():
    assert row_termination([5, 6, EOS], "eos", 8, [EOS]) is None
    assert row_termination([5, 6, 7], "length", 3, [EOS]) is None
    assert row_termination([5, STOP], "stop", 8, [EOS], [STOP]) is None
    assert row_termination([5, 6], "length", 3, [EOS]) == ("claimed the length limit with 2 "
                                                           "of 3 tokens")
    assert "not EOS" in row_termination([5, 6], "eos", 3, [EOS])
    assert "past an EOS" in row_termination([5, EOS, 6], "length", 3, [EOS])
    assert row_termination([5, 6, 7, 8], "length", 3, [EOS]) == "4 tokens > limit 3"
    assert "ended on EOS" in row_termination([5, 6, EOS], "length", 3, [EOS])
    assert "not one" in row_termination([5, 6], "stop", 3, [EOS], [STOP])
    assert "unknown finish reason 'abort'" in row_termination([5], "abort", 3, [EOS])
    assert row_termination([], "eos", 3, [EOS]) is not None
    assert row_termination([5, 6, EOS], "eos", 8, []) is not None  # ignore_eos: EOS is a token
    # a file: one finding over its rows, naming the first bad one
    assert check_termination([([5, EOS], "eos", 8), ([5, 6, 7], "length", 3)], [EOS]) is None
    f = check_termination([([5, EOS], "eos", 8), ([5, 6], "length", 3), ([7], "eos", 8)], [EOS])
    assert f.check is Check.TERMINATION and f.severity is Severity.HARD
    assert f.numbers == {"bad_rows": 2, "first": 1} and f.reason.startswith("2 of 3 rows")


def test_decide_hard_beats_soft():
    soft = Finding(Check.SHA256, Severity.SOFT, "x")
    hard = Finding(Check.REWARDS, Severity.HARD, "y")
    assert decide([]).kind is VerdictKind.ACCEPT and decide([]).accepted
    assert decide([soft]).kind is VerdictKind.SOFT_INVALID
    d = decide([soft, hard], {"rows": 3})
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.REWARDS, Check.SHA256)
    assert d.reason == "rewards: y; sha256: x" and d.stats == {"rows": 3} and not d.accepted
    out = give_up("timeout", 6)
    assert out.kind is VerdictKind.SOFT_INVALID and out.checks == (Check.VALIDATOR_ERROR,)
    assert "after 6 attempts: timeout" in out.reason


def test_backoff_doubles_and_caps():
    cfg = RetryConfig(backoff=1.0, max_backoff=5.0, jitter=0.0)
    assert [backoff_delay(i, cfg) for i in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    d = backoff_delay(1, RetryConfig(jitter=0.5), random.Random(0))
    assert 1.0 <= d <= 1.5


def test_state_resumes_and_never_requeues_judged(tmp_path):
    path = tmp_path / "state.json"
    st = ValidatorState.load(path, start_block=7)
    assert st.next_block == 7
    jobs = [Job("aa", "a1", A, B, 1, 10, 8), Job("bb", "b1", A, B, 1, 10, 9)]
    st.enqueue(jobs, 10)
    st.record(jobs[0], "accept")
    again = ValidatorState.load(path, 0)
    assert again.next_block == 10 and [j.work_id for j in again.queue] == ["bb"]
    again.enqueue([Job("aa", "a1", A, B, 1, 10, 8), Job("bb", "b1", A, B, 1, 10, 9)], 12)
    assert [j.work_id for j in again.queue] == ["bb"] and again.judged == {"aa": "accept"}


def test_a_verdict_not_yet_posted_survives_a_restart_typed(tmp_path):
    """A verdict the orchestrator has not taken stays in state.json and comes back as the
    same `Verdict` (its kind an enum), so a restart posts it unchanged; once posted it is gone."""
    from meshrl.wire.models import Verdict, VerdictKind

    path = tmp_path / "state.json"
    st = ValidatorState.load(path, start_block=0)
    job = Job("cc", "c1", A, B, 1, 10, 8)
    st.enqueue([job], 9)
    v = Verdict(sha256="c" * 64, work_id="d" * 64, verdict=VerdictKind.HARD_INVALID,
                reason="rewards: row 3 claims 1.0, recomputed 0.0")
    st.record(job, v.verdict.value, v)
    again = ValidatorState.load(path, 0)
    assert again.outgoing == [v] and again.outgoing[0].verdict is VerdictKind.HARD_INVALID
    again.posted(v)
    assert ValidatorState.load(path, 0).outgoing == []


def test_an_honest_file_of_one_row_group_a_row_is_judged_not_refused(engine, tok):
    """Issue #41 (low): the same honest file, written one row group per row, was refused by the
    reader (a schema finding, hence a slash); it is read by the pool's limits and accepted."""
    r = rules(max_new=8, prompts=4, group=4)  # 16 rows: 16 row groups
    rf = honest_file(engine, tok, r)
    data = write_parquet(columns(rf), header_bytes(rf), row_group_size=1)
    assert pq.ParquetFile(pa.BufferReader(data)).metadata.num_row_groups == 16
    back = read_rollout_file(data, file_limits(r))
    d = verify_file(engine, tok, back, claim(back), r, r.task.build())
    assert d.accepted, d.reason
