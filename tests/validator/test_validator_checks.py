"""The model-free checks and the verdict policy, by hand-checked values."""

import hashlib
import random

from meshrl.validator.checks import (
    Finding,
    check_node,
    check_policy_version,
    check_prompts,
    check_rewards,
    check_sampling_params,
    check_sha256,
    check_work_units,
)
from meshrl.validator.policy import RetryConfig, backoff_delay, decide, give_up
from meshrl.validator.state import Job, ValidatorState

A, B = "0x" + "1" * 40, "0x" + "2" * 40


def test_sha256_is_soft_and_names_both_hashes():
    data = b"rollouts"
    good = hashlib.sha256(data).hexdigest()
    assert check_sha256(data, good) is None and check_sha256(data, "0x" + good.upper()) is None
    f = check_sha256(data + b"!", good)
    assert f.severity == "soft" and f.numbers["chain"] == good and f.numbers["bytes"] == 9


def test_node_and_units():
    assert check_node(A, B, A.upper().replace("0X", "0x"), B) is None
    assert check_node(A, B, B, B).severity == "hard"
    assert check_work_units(30, 30, [5, 5], [10, 10]) is None
    f = check_work_units(60, 60, [5, 5], [10, 10])
    assert f.severity == "hard" and f.numbers == {"chain": 60, "file": 60, "tokens": 30}
    assert check_work_units(30, 31, [5, 5], [10, 10]).numbers["chain"] == 31


def test_prompts_rows_and_groups():
    assigned = [[1, 2], [3]]
    assert check_prompts([[1, 2], [1, 2], [3], [3]], assigned, 2) is None
    f = check_prompts([[1, 2], [1, 2], [3], [4]], assigned, 2)
    assert f.numbers == {"bad_rows": 1, "first": 3}
    assert check_prompts([[1, 2], [3]], assigned, 2).numbers == {"rows": 2, "expected": 4}


def test_policy_version_window():
    assert check_policy_version(3, 5, 2) is None and check_policy_version(5, 5, 0) is None
    assert check_policy_version(2, 5, 2).numbers == {"version": 2, "step": 5, "async_level": 2}
    assert check_policy_version(6, 5, 2) is not None  # from the future


def test_sampling_params_and_rewards():
    order = {"temperature": 1.0, "max_new_tokens": 8}
    assert check_sampling_params({**order, "top_p": 1.0}, order, 5, 5) is None
    f = check_sampling_params({"temperature": 0.0, "max_new_tokens": 8}, order, 5, 6)
    assert "seed 5 != 6" in f.reason and "temperature 0.0 != 1.0" in f.reason
    assert check_rewards([1.0, 0.0], [1.0, 0.0]) is None
    f = check_rewards([1.0, 1.0, float("nan")], [1.0, 0.0, 0.0])
    assert f.numbers["bad_rows"] == 2 and "row 1: claims 1.0, recomputed 0.0" in f.reason


def test_decide_hard_beats_soft():
    soft, hard = Finding("sha256", "soft", "x"), Finding("rewards", "hard", "y")
    assert decide([]).kind == "accept"
    assert decide([soft]).kind == "soft"
    d = decide([soft, hard])
    assert d.kind == "hard" and d.checks == ("rewards", "sha256") and d.reason.startswith("rew")
    assert give_up("timeout", 6).kind == "soft"


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
