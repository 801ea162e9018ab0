"""Scoring untrusted completion text in a child process that is killed at a deadline.

A math answer such as `\\boxed{9^{9^{9^{9}}}}` sends sympy into an integer power that holds the
GIL: run in a thread, it froze a whole validator (no verdict, no chain poll, no heartbeat) until
the process was killed, and since the job stayed queued a restart froze again (issue #41). A
thread cannot be stopped and math-verify's own timeout (SIGALRM) works on a main thread only,
and not inside a C call at all. So every math-verify score runs in one persistent child process
(`meshrl.tasks.scoring_child`, started once per process and reused for every row: a round
trip is a pipe write and read); the caller waits for the answer without holding the GIL, and
when a row's deadline passes it kills the child, reaps it and starts a fresh one for the next row.

Every other task kind whose scorer parses untrusted text with code meshrl does not control
(reasoning-gym's `score_answer`: `countdown` evaluates `9**9**9**9` with sympy and never ends;
a `verifiers` environment's reward functions) scores in the same child (`task_score`): the
parent sends the task's config once per child (the child builds the task, as every role does,
outside any row's deadline) and then one row at a time, each under the task's `timeout_s`.

The pool rule (docs/tasks.md, *Unscorable answers*): a completion the verifier cannot score
within the task's `timeout_s` scores 0. Worker, validator and trainer all score through this
module, so they apply the same rule. A child that cannot start is an error of the scoring
machine (`VerifierUnavailable`), never a score.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from meshrl.log import get_logger, log_event
from meshrl.tasks.base import Problem

__all__ = ["KillableScorer", "ScoreOutcome", "VerifierUnavailable", "math_verify_outcome",
           "scorer", "task_score_outcome"]

log = get_logger("meshrl.tasks.killable")

# the child is a module of its own: nothing here imports the tasks it builds
_CHILD = "from meshrl.tasks.scoring_child import main; main()"
START_TIMEOUT_S = 120.0  # importing math-verify / sympy on a loaded machine; not a row's time
MEMORY_BYTES = 2 << 30  # what one row may add to the child's address space
_MAX_LINE = 1 << 20  # an answer line is a few bytes; more is a broken child
_DIED = b"\0died"  # _readline's mark of a child whose output ended (never a JSON line)


class VerifierUnavailable(RuntimeError):
    """The scoring child could not be started or answered nonsense: the scorer's fault, so a
    caller must not turn it into a reward (a validator leaves the file unjudged)."""


@dataclass(frozen=True)
class ScoreOutcome:
    """A row's score and whether it is the timeout rule's 0 (`timed_out`)."""

    score: float
    timed_out: bool
    seconds: float


class KillableScorer:
    """One persistent scoring child, used by one caller at a time (a lock), replaced when a
    row's deadline passes or when this process is a fork of the one that started it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0
        self._buf = b""
        self._built: set[str] = set()  # task specs the live child has built
        self.kills = 0  # children killed at a deadline (for logs and tests)

    @property
    def pid(self) -> int | None:
        """The live child's process id (None before the first row or after a kill)."""
        return self._proc.pid if self._proc is not None else None

    def math_verify(self, answer: str, completion: str, timeout_s: float) -> ScoreOutcome:
        """math-verify's score of `completion` against `answer`, or 0 (timed out) when the
        child has not answered `timeout_s` seconds after it was asked. A child that dies
        before its deadline (killed from outside, a crash) is replaced and the row asked once
        more, so only a row that kills two children in a row scores 0 for it."""
        return self._score({"a": answer, "c": completion, "t": timeout_s}, None, timeout_s,
                           len(answer), len(completion))

    def task_score(self, spec: dict[str, Any], problem: Problem, completion: str,
                   timeout_s: float) -> ScoreOutcome:
        """`Task.score` of the task `spec` (its config, `model_dump(mode="json")`) on
        `completion`, in the child: 0 (timed out) past `timeout_s`, like `math_verify`. The
        child builds the task from `spec` once (outside the deadline); a spec it cannot build
        is `VerifierUnavailable`."""
        msg = {"op": "score", "k": _spec_key(spec), "p": [problem.task, problem.prompt,
                                                          problem.answer, problem.meta],
               "c": completion, "t": timeout_s}
        return self._score(msg, spec, timeout_s, len(problem.answer), len(completion))

    def _score(self, msg: dict[str, Any], spec: dict[str, Any] | None, timeout_s: float,
               answer_chars: int, completion_chars: int) -> ScoreOutcome:
        with self._lock:
            for attempt in (1, 2):
                out = self._ask(msg, spec, timeout_s, answer_chars, completion_chars)
                if out is not None:
                    return out
                log_event(log, "scoring child died before its deadline", attempt=attempt,
                          level=logging.WARNING)
            return ScoreOutcome(0.0, True, 0.0)

    def _build(self, spec: dict[str, Any]) -> None:
        """Have the current child build the task `spec` (once per child; not a row's time)."""
        key = _spec_key(spec)
        if key in self._built:
            return
        assert self._proc is not None and self._proc.stdin is not None
        line = json.dumps({"op": "build", "k": key, "spec": spec,
                           "path": [p for p in sys.path if p]})
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            self._stop()
            raise VerifierUnavailable("the scoring child died while building a task") from None
        got = self._readline(time.monotonic() + START_TIMEOUT_S)
        try:
            answer = json.loads(got) if isinstance(got, bytes) and got != _DIED else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("built") != key:
            self._stop()
            why = answer.get("error") if isinstance(answer, dict) else "no answer"
            raise VerifierUnavailable(f"the scoring child cannot build task "
                                      f"{spec.get('type')!r}: {why}")
        self._built.add(key)

    def _ask(self, req: dict[str, Any], spec: dict[str, Any] | None, timeout_s: float,
             answer_chars: int, completion_chars: int) -> ScoreOutcome | None:
        """One row on the current child; None when the child died before answering."""
        self._ensure()
        if spec is not None:
            self._build(spec)
        assert self._proc is not None and self._proc.stdin is not None
        t0 = time.monotonic()
        msg = json.dumps(req).encode() + b"\n"
        try:
            self._proc.stdin.write(msg)
            self._proc.stdin.flush()
        except OSError:  # the child died between rows
            self._stop()
            return None
        line = self._readline(t0 + timeout_s)
        took = time.monotonic() - t0
        if line is _DIED:
            self._stop()
            return None
        if line is None:
            pid = self.pid
            self._stop()
            self.kills += 1
            log_event(log, "verifier deadline: scoring child killed, row scores 0",
                      seconds=round(took, 3), timeout_s=timeout_s, pid=pid,
                      answer_chars=answer_chars, completion_chars=completion_chars,
                      level=logging.WARNING)
            return ScoreOutcome(0.0, True, took)
        try:
            score = float(json.loads(line)["s"])
        except (ValueError, KeyError, TypeError):
            self._stop()
            raise VerifierUnavailable("the scoring child answered nonsense") from None
        if not 0.0 <= score <= 1.0:  # a NaN fails too: never a reward outside the task's range
            self._stop()
            raise VerifierUnavailable(f"the scoring child answered score {score}")
        return ScoreOutcome(score, False, took)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure(self) -> None:
        if self._proc is not None and self._owner == os.getpid() and self._proc.poll() is None:
            return
        if self._owner != os.getpid():
            self._proc = None  # a fork's copy: its pipes are the parent's, never touch them
        self._stop()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": _pythonpath(),
                                              "MESHRL_SCORER_PARENT": str(os.getpid())})
        except OSError as e:
            raise VerifierUnavailable(f"cannot start the scoring child: {e}") from None
        self._owner, self._buf, self._built = os.getpid(), b"", set()
        ready = self._readline(time.monotonic() + START_TIMEOUT_S)
        if ready != b"ready":
            self._stop()
            raise VerifierUnavailable("the scoring child did not start")

    def _readline(self, deadline: float) -> bytes | None:
        """The child's next line, None when `deadline` passes, `_DIED` when the child's
        output ends first (it died: killed from outside, a crash, a broken stream)."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk or len(self._buf) > _MAX_LINE:
                    return _DIED
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._built = set()
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def _pythonpath() -> str:
    """The parent's import path for the child, so it imports the same meshrl (an editable
    checkout, a worktree on PYTHONPATH)."""
    return os.pathsep.join(p for p in sys.path if p)


_SCORER: KillableScorer | None = None
_SCORER_LOCK = threading.Lock()


def scorer() -> KillableScorer:
    """This process's scoring child (started on first use, closed at exit)."""
    global _SCORER
    with _SCORER_LOCK:
        if _SCORER is None:
            _SCORER = KillableScorer()
            atexit.register(_SCORER.close)
        return _SCORER


def math_verify_outcome(answer: str, completion: str, timeout_s: float) -> ScoreOutcome:
    """`KillableScorer.math_verify` on this process's scorer."""
    return scorer().math_verify(answer, completion, timeout_s)


def task_score_outcome(spec: dict[str, Any], problem: Problem, completion: str,
                       timeout_s: float) -> ScoreOutcome:
    """`KillableScorer.task_score` on this process's scorer."""
    return scorer().task_score(spec, problem, completion, timeout_s)


def _spec_key(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def _score_in_process(answer: str, completion: str, timeout_s: float) -> float:
    """math-verify in this (the child's) main thread, its own SIGALRM timeouts on."""
    from math_verify import parse, verify

    gold_text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
    timeout = max(1, int(timeout_s))
    try:
        gold = parse(gold_text, parsing_timeout=timeout)
        pred = parse(completion, parsing_timeout=timeout)
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    except Exception:  # malformed LaTeX is a wrong answer, not a crash
        return 0.0
