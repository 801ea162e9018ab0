"""The scoring child runs in bubblewrap (tasks/killable.py, issue #41): reasoning-gym scorers that
call sympy's `parse_expr` `eval` the worker's answer, so an answer is Python that ran in the
worker, the validator and the trainer. Each hostile answer below is built so it scores 1.0 exactly
when its attack worked (`(right answer) * (1 + (attack result != expected))`, on
simple_integration, whose scorer `parse_expr`s the answer and is reproducible across processes):
unsandboxed every one scored 1.0 and left its trace; sandboxed each scores 0 and leaves none,
while honest answers score exactly as in the caller's process."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from meshrl.tasks import GymConfig, TasksConfig
from meshrl.tasks.base import Problem
from meshrl.tasks.killable import KillableScorer, ScoringSandboxUnavailable

DEADLINE = 20.0  # far above an honest row; a hostile row here ends well before it


@pytest.fixture(scope="module")
def integration():
    # the answer screen off (GymTask's `screen_answers`): these answers test the sandbox alone
    tasks = TasksConfig(mix=[GymConfig(dataset="simple_integration", timeout_s=DEADLINE,
                                       screen_answers=False)]).build()
    task = tasks.tasks["rg/simple_integration"]
    return task, task.sample(random.Random(3))


@pytest.fixture(scope="module")
def child():
    """One child for the module, as a role has one: each test also shows the rows before it
    left nothing behind. It starts with a secret in the role's environment."""
    os.environ["MESHRL_TEST_SECRET"] = "envsecret"
    s = KillableScorer()
    try:
        assert s.math_verify("1", "\\boxed{1}", DEADLINE).score == 1.0  # started now
    finally:
        del os.environ["MESHRL_TEST_SECRET"]
    yield s
    s.close()


def _score(s: KillableScorer, task, problem: Problem, answer: str,
           deadline: float = DEADLINE) -> float:
    spec, _ = task.killable()
    return s.task_score(spec, problem, f"<answer>{answer}</answer>", deadline).score


def _attack(problem: Problem, effect: str, expected: str) -> str:
    """An answer scoring 1.0 iff `effect` (Python in the scorer) evaluates to `expected`."""
    return f"({problem.answer})*(1+(({effect})!=({expected})))"


def _processes_with(marker: str) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    found.append(int(d))
            except OSError:
                pass
    return found


def test_the_attack_answers_are_right_answers_in_form(integration, child):
    """The control: the right answer scores 1.0 through the child, an attack whose effect is
    harmless Python scores 1.0 too (the shape works), a wrong answer 0."""
    task, p = integration
    assert _score(child, task, p, p.answer) == 1.0
    assert _score(child, task, p, _attack(p, "'a'+'b'", "'ab'")) == 1.0
    assert _score(child, task, p, "x") == 0.0


def test_answer_code_reads_no_secret_writes_nothing_and_reaches_no_network(
        integration, child, tmp_path):
    task, p = integration
    secret = tmp_path / "node.key"
    secret.write_text("0xsecretkey")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    probe = f"/tmp/meshrl-scoring-probe-{uuid.uuid4().hex}"
    attacks = {
        "read a key file": _attack(p, f"open('{secret}').read()", "'0xsecretkey'"),
        "read the environment": _attack(p, "__import__('os').environ.get('MESHRL_TEST_SECRET')",
                                        "'envsecret'"),
        "write next to the key": _attack(p, f"open('{tmp_path}/pwned','w').write('x')",
                                         "len('x')"),
        "connect to loopback": _attack(
            p, f"__import__('socket').create_connection(('127.0.0.1',"
               f"__import__('builtins').int('{port}'))).close()", "None"),
    }
    try:
        scores = {why: _score(child, task, p, answer) for why, answer in attacks.items()}
        # a write to /tmp lands in the sandbox's private tmpfs (it may succeed: 1.0), and a
        # later row finds nothing an earlier row wrote (the sandbox's /tmp is emptied)
        _score(child, task, p, _attack(p, f"open('{probe}','w').write('x')", "len('x')"))
        scores["find the earlier row's file"] = _score(
            child, task, p, _attack(p, f"__import__('os').path.exists('{probe}')", "True"))
        try:
            listener.accept()[0].close()
            connected = True
        except TimeoutError:
            connected = False
    finally:
        listener.close()
        Path(probe).unlink(missing_ok=True)
    assert scores == dict.fromkeys(scores, 0.0)
    assert not connected
    assert not (tmp_path / "pwned").exists() and not Path(probe).exists()
    assert secret.read_text() == "0xsecretkey"
    # and the sandbox did not cost an honest answer its score
    assert _score(child, task, p, p.answer) == 1.0


@pytest.mark.timeout(60)
def test_a_process_an_answer_starts_does_not_outlive_its_row(integration, child):
    """Started in the background (a new session, so no process group of the row's holds it),
    and started by a row that then hangs past its deadline: gone either way."""
    task, p = integration
    markers = [f"meshrl-linger-{uuid.uuid4().hex}" for _ in range(2)]
    spawn = ("__import__('subprocess').Popen([__import__('sys').executable,'-c',"
             "'import time; time.sleep(int(\"60\"))','{m}'],start_new_session=True).poll()")
    try:
        # starting it may succeed inside the sandbox (1.0); it is gone when the row's answer is
        _score(child, task, p, _attack(p, spawn.format(m=markers[0]), "None"))
        alive = _processes_with(markers[0])
        assert child.pid is not None  # the child lives on, its row's process does not
        t0 = time.monotonic()
        hang = f"[{spawn.format(m=markers[1])}, all(iter(lambda: True, None))]"  # spins
        out = child.task_score(task.killable()[0], p, f"<answer>{_attack(p, hang, 'None')}"
                               f"</answer>", 3.0)
        assert out.timed_out and out.score == 0.0 and time.monotonic() - t0 < 10
        for _ in range(100):  # the pid namespace is torn down as bwrap dies
            if not _processes_with(markers[1]):
                break
            time.sleep(0.02)
        alive += _processes_with(markers[1])
    finally:
        for pid in _processes_with(markers[0]) + _processes_with(markers[1]):
            os.kill(pid, signal.SIGKILL)
    assert alive == []
    assert _score(child, task, p, p.answer) == 1.0


def test_a_row_cannot_change_how_later_rows_score(integration, child):
    """A row that patches the scorer (sympy's `simplify` always 0: every answer right, as the scorer
    checks `simplify(derivative - integrand) == 0`) changes
    nothing for the next row: each row is scored in a process of its own."""
    task, p = integration
    patch = "setattr(__import__('sympy'),'simplify',__import__('sympy').S.Zero.__mul__)"
    assert _score(child, task, p, _attack(p, patch, "None")) in (0.0, 1.0)
    assert _score(child, task, p, "x") == 0.0  # patched, any answer would score 1.0
    assert _score(child, task, p, p.answer) == 1.0


def test_honest_answers_score_as_in_the_callers_process(child):
    """countdown and puzzle24 (`parse_expr` of the answer), simple_integration (`parse_expr`,
    `diff`, `simplify`), chain_sum (no sympy): right, wrong and empty answers."""
    for dataset in ("countdown", "chain_sum", "simple_integration", "puzzle24"):
        tasks = TasksConfig(mix=[GymConfig(dataset=dataset, timeout_s=DEADLINE)]).build()
        task = tasks.tasks[f"rg/{dataset}"]
        rng = random.Random(7)
        seen = set()
        for i in range(6):
            p = task.sample(rng)
            said = p.answer if i % 2 == 0 else ["1+2", "", "x**2", "4*(3+1)-8", "999"][i % 5]
            want = task.score(p, f"<answer>{said}</answer>")
            seen.add(want)
            assert _score(child, task, p, said) == want, (dataset, said)
        assert max(seen) == 1.0  # the right answers did score


def test_no_bwrap_refuses_the_mix_in_one_line_unless_opted_out(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    monkeypatch.delenv("MESHRL_SCORING_UNSANDBOXED", raising=False)
    cfg = TasksConfig(mix=[GymConfig(dataset="chain_sum")])
    with pytest.raises(ScoringSandboxUnavailable, match="'bwrap' not found") as err:
        cfg.build()
    assert "\n" not in str(err.value)
    s = KillableScorer()  # a caller that skips the build check is refused at the child too
    try:
        task_cfg = cfg.mix[0].model_dump(mode="json")
        with pytest.raises(ScoringSandboxUnavailable):
            s.task_score(task_cfg, Problem("rg/chain_sum", "", "3", {"split": "train",
                                                                     "index": 0}),
                         "<answer>3</answer>", DEADLINE)
    finally:
        s.close()
    monkeypatch.setenv("MESHRL_SCORING_UNSANDBOXED", "1")  # the documented opt-out
    task = cfg.build().tasks["rg/chain_sum"]
    p = task.sample(random.Random(0))
    s = KillableScorer()
    try:
        assert _score(s, task, p, p.answer) == 1.0
    finally:
        s.close()


def test_every_dataset_whose_scorer_evaluates_text_is_forked_per_row():
    """A row is scored without a fork of its own only when nothing in its dataset's source
    can run text: each dataset found calling sympy's `parse_expr` forks (a row of it could
    patch the scorer otherwise); plain parsers (chain_sum, leg_counting) save the fork."""
    from meshrl.tasks.gym import GymConfig

    evaluating = ["countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                  "intermediate_integration"]
    for name in evaluating:
        assert GymConfig(dataset=name).build().runs_answer_code(), name
    for name in ["chain_sum", "leg_counting"]:
        assert not GymConfig(dataset=name).build().runs_answer_code(), name
