"""math-verify scores in a child killed at its deadline (tasks/killable.py, issue #41): an answer
that sends sympy into a GIL-holding integer power ends at the deadline as a 0, the child that
hung is gone, the caller's event loop keeps running meanwhile, and the next row scores."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from pathlib import Path

import pytest

from meshrl.tasks import MathConfig, TasksConfig, compute_reward
from meshrl.tasks.base import Problem
from meshrl.tasks.dataset import math_verify_score
from meshrl.tasks.killable import KillableScorer

# held the GIL for over 40 s in a thread before this change (the whole process froze)
HANG = "The answer is \\boxed{9^{9^{9^{9}}}}"
DEADLINE = 2.0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); a reaped child does not
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.timing
def test_a_hanging_answer_ends_at_the_deadline_and_its_child_is_gone():
    s = KillableScorer()
    try:
        assert s.math_verify("2", "so \\boxed{2}", DEADLINE).score == 1.0  # the child is up
        pid = s.pid
        assert pid is not None
        t0 = time.monotonic()
        out = s.math_verify("1", HANG, DEADLINE)
        took = time.monotonic() - t0
        assert out.timed_out and out.score == 0.0
        assert DEADLINE <= took < DEADLINE + 1.5
        assert _gone(pid) and s.pid is None and s.kills == 1
        # the next row gets a fresh child and scores as before
        assert s.math_verify("1/2", "\\boxed{0.5}", DEADLINE).score == 1.0
        assert s.pid not in (None, pid)
        assert not s.math_verify("1/2", "\\boxed{0.25}", DEADLINE).timed_out
    finally:
        s.close()


@pytest.mark.timing
def test_the_event_loop_keeps_beating_while_a_row_hangs(tmp_path):
    """Validator-shaped: the reward is computed in `asyncio.to_thread` (as the judge runs
    `verify_files`) while a heartbeat task ticks; before, the hung row starved every thread."""
    jl = tmp_path / "m.jsonl"
    jl.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    task = TasksConfig(mix=[MathConfig(path=str(jl), timeout_s=DEADLINE)]).build()
    problem = Problem("math", "p", "1", {"index": 0})
    compute_reward(problem, "\\boxed{1}", 4, task)  # the child is started before timing

    async def go() -> tuple[float, float, float]:
        beats: list[float] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                beats.append(time.monotonic())
                await asyncio.sleep(0.05)

        hb = asyncio.create_task(heartbeat())
        t0 = time.monotonic()
        r = await asyncio.to_thread(compute_reward, problem, HANG, 12, task)
        took = time.monotonic() - t0
        stop.set()
        await hb
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        return r.total, took, max(gaps)

    total, took, worst_gap = asyncio.run(go())
    assert total == 0.0 and took < DEADLINE + 1.5
    assert worst_gap < 0.5  # the loop ran all along (a chain poll, a heartbeat would too)


@pytest.mark.parametrize(("answer", "completion", "score"), [
    ("0.5", "so it is \\boxed{\\frac{1}{2}}", 1.0), ("0.5", "\\boxed{0.25}", 0.0),
    ("0.5", "\\boxed{\\frac{1}{", 0.0), ("5x", "$\\boxed{5x}$", 1.0), ("2", "", 0.0)])
def test_scores_are_math_verifys(answer, completion, score):
    assert math_verify_score(answer, completion, 5.0) == score


def test_a_child_killed_from_outside_costs_no_row_its_score():
    """A child that dies before its deadline (the OOM killer, an operator) is replaced and the
    row asked again: it must not score as an unscorable 0."""
    import signal

    s = KillableScorer()
    try:
        assert s.math_verify("3", "\\boxed{3}", DEADLINE).score == 1.0
        pid = s.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out = s.math_verify("3", "\\boxed{3}", DEADLINE)
        assert out.score == 1.0 and not out.timed_out and s.pid not in (None, pid)
        assert s.kills == 0
    finally:
        s.close()


def test_a_hung_child_dies_with_its_parent(tmp_path):
    """A role killed while a row hangs leaves no sympy running (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        "from meshrl.tasks.killable import KillableScorer\n"
        "s = KillableScorer()\n"
        "s.math_verify('1', '\\\\boxed{1}', 60.0)\n"
        "print(s.pid, flush=True)\n"
        f"s.math_verify('1', {HANG!r}, 600.0)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the child is inside the hanging row now
        assert not _gone(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    t0 = time.monotonic()
    while not _gone(child) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert _gone(child)


# reasoning-gym's countdown scores with sympy's `parse_expr`, which evaluates the power: in the
# caller's process this never ended (the validator froze, issue #41)
GYM_HANG = "<answer>9**9**9**9</answer>"


def _timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


@pytest.mark.timing
@pytest.mark.timeout(120)
def test_a_reasoning_gym_answer_that_hangs_its_scorer_scores_0_at_the_deadline():
    import random

    from meshrl.tasks import GymConfig

    tasks = TasksConfig(mix=[GymConfig(dataset="countdown", timeout_s=DEADLINE)]).build()
    p = tasks.tasks["rg/countdown"].sample(random.Random(0))
    good = f"<answer>{p.answer}</answer>"
    assert compute_reward(p, good, 5, tasks).task == 1.0  # child up, task built
    r, took = _timed(compute_reward, p, GYM_HANG, 5, tasks)
    assert r.task == 0.0 and DEADLINE <= took < DEADLINE + 1.5
    assert compute_reward(p, good, 5, tasks).task == 1.0  # a fresh child rebuilds the task
    assert compute_reward(p, "<answer>1+1</answer>", 5, tasks).task == 0.05  # its own scale


@pytest.mark.timing
@pytest.mark.timeout(120)
def test_a_verifiers_reward_that_backtracks_forever_scores_0_at_the_deadline(monkeypatch):
    from meshrl.tasks import EnvironmentConfig

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "vf_envs"))
    tasks = TasksConfig(mix=[EnvironmentConfig(env="meshrl_vf_regex", heldout_fraction=0,
                                               timeout_s=DEADLINE)]).build()
    p = tasks.tasks["vf/meshrl_vf_regex"].problem_at(0)
    assert compute_reward(p, "aab", 3, tasks).task == 1.0
    r, took = _timed(compute_reward, p, "a" * 64 + "c", 65, tasks)
    assert r.task == 0.0 and DEADLINE <= took < DEADLINE + 1.5


def test_a_task_the_child_cannot_build_is_verifier_unavailable_never_a_score():
    from meshrl.tasks.killable import VerifierUnavailable

    s = KillableScorer()
    try:
        with pytest.raises(VerifierUnavailable, match="cannot build task 'reasoning_gym'"):
            s.task_score({"type": "reasoning_gym", "dataset": "no_such_dataset"},
                         Problem("rg/x", "q", "1", {"split": "train", "index": 0}), "1",
                         DEADLINE)
    finally:
        s.close()
