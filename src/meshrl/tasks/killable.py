# over 400 lines: the killable, sandboxed scoring child's parent side: start, build, deadline,
#  restart and the sandbox's binds
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

Some of those scorers run what they are given: sympy's `parse_expr` (reasoning-gym's countdown,
puzzle24, polynomial_multiplication, the integration datasets) `eval`s its text, so
`<answer>__import__('os').getpid()</answer>` ran in the worker, the validator and the trainer
(issue #41). So the child runs in Debian's bubblewrap, like a code task's program
(`meshrl.tasks.sandbox`): every namespace unshared (no network), a new session, dead with its
parent, capabilities dropped; the file system only `/usr`, the Python installation, its venv and
the directories on the import path, all read-only (never the working directory, the home
directory itself or `/`: a role's keys and run directory stay out of sight), a private 16 MiB
`/tmp` the only place it can write, no environment but PATH/HOME/LANG/PYTHONPATH. Inside, every
row whose scorer may run its text (`Task.runs_answer_code`) is scored in a process forked for it
(`scoring_child`), so a row cannot change how a later row scores; after it, every other process
of the sandbox is killed and `/tmp` emptied. A machine without bwrap refuses these tasks when
the mix is built (`ScoringSandboxUnavailable`, one line) unless `MESHRL_SCORING_UNSANDBOXED=1`
(off by default; docs/tasks.md) says to score unsandboxed.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from meshrl.log import get_logger, log_event
from meshrl.tasks.base import Problem
from meshrl.tasks.sandbox import SandboxUnavailable

__all__ = ["UNSANDBOXED_ENV", "KillableScorer", "ScoreOutcome", "ScoringSandboxUnavailable",
           "VerifierUnavailable", "check_scoring_sandbox", "math_verify_outcome", "scorer",
           "task_score_outcome"]

log = get_logger("meshrl.tasks.killable")

# the child is a module of its own: nothing here imports the tasks it builds
_CHILD = "from meshrl.tasks.scoring_child import main; main(sandboxed={})"
START_TIMEOUT_S = 120.0  # importing math-verify / sympy on a loaded machine; not a row's time
MEMORY_BYTES = 2 << 30  # what one row may add to the child's address space
_MAX_LINE = 1 << 20  # an answer line is a few bytes; more is a broken child
_DIED = b"\0died"  # _readline's mark of a child whose output ended (never a JSON line)
# the documented, off-by-default opt-out: "1" scores in an unsandboxed child (a machine without
# bwrap that only scores tasks it trusts); read here only, when a child starts or a mix is built
UNSANDBOXED_ENV = "MESHRL_SCORING_UNSANDBOXED"
_TMP_BYTES = 16 << 20  # the sandbox's private /tmp


class VerifierUnavailable(RuntimeError):
    """The scoring child could not be started or answered nonsense: the scorer's fault, so a
    caller must not turn it into a reward (a validator leaves the file unjudged)."""


class ScoringSandboxUnavailable(VerifierUnavailable, SandboxUnavailable):
    """No bubblewrap sandbox for the scoring child on this machine: tasks whose scorers run on
    untrusted text are refused (never scored unsandboxed unless `UNSANDBOXED_ENV` says so)."""


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
        self._path: tuple[str, ...] = ()  # sys.path when the live child started (its binds)
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
        sandboxed = not _unsandboxed()
        if (self._proc is not None and self._owner == os.getpid() and self._proc.poll() is None
                # a sandboxed child sees only the import path it started with: a new entry
                # (an environment package) needs a child with that directory bound
                and (not sandboxed or self._path == tuple(sys.path))):
            return
        if self._owner != os.getpid():
            self._proc = None  # a fork's copy: its pipes are the parent's, never touch them
        self._stop()
        path = tuple(sys.path)
        if sandboxed:
            cmd, env = _sandbox_command(), None
        else:
            cmd = [sys.executable, "-c", _CHILD.format(False)]
            env = {**os.environ, "PYTHONPATH": _pythonpath(),
                   "MESHRL_SCORER_PARENT": str(os.getpid())}
        try:
            # its own process group: `_stop` kills bwrap and with it the sandbox's pid namespace
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          env=env, start_new_session=True, close_fds=True)
        except OSError as e:
            raise VerifierUnavailable(f"cannot start the scoring child: {e}") from None
        self._owner, self._buf, self._built, self._path = os.getpid(), b"", set(), path
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
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's group: its pid namespace dies too
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


def _unsandboxed() -> bool:
    return os.environ.get(UNSANDBOXED_ENV, "") == "1"


def _bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise ScoringSandboxUnavailable(
            "scoring sandbox: bubblewrap binary 'bwrap' not found (apt-get install bubblewrap); "
            f"untrusted answers are never scored unsandboxed unless {UNSANDBOXED_ENV}=1")
    return found


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _read_only_roots() -> list[str]:
    """The directories the child may read: the Python installation and venv, the directory
    meshrl is imported from and the import path's directories; never the working directory or
    a directory above it (a run directory, a repository with its keys), the home directory
    itself or `/`. Under `/usr` is bound anyway."""
    import meshrl

    cwd, home = os.path.abspath(os.getcwd()), os.path.abspath(os.path.expanduser("~"))
    wanted = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.dirname(os.path.abspath(meshrl.__file__)))]
    for p in sys.path:
        if p and os.path.isdir(p):
            p = os.path.abspath(p)
            if not _inside(cwd, p) and p != home:
                wanted.append(p)
    roots: list[str] = []
    for p in sorted(set(map(os.path.abspath, wanted)), key=len):
        if p != "/" and p != home and not _inside(p, "/usr") \
                and not any(_inside(p, r) for r in roots):
            roots.append(p)
    return roots


def _sandbox_command() -> list[str]:
    """bwrap running the scoring child (see the module's docstring for what it may touch)."""
    # the private /tmp first: a bind below /tmp (a checkout there) then shows through it
    mounts = ["--size", str(_TMP_BYTES), "--tmpfs", "/tmp", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            mounts += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            mounts += ["--ro-bind", f"/{link}", f"/{link}"]
    for root in _read_only_roots():
        mounts += ["--ro-bind", root, root]
    # fontconfig's settings (matplotlib, imported by some reasoning-gym datasets, asks for them)
    mounts += ["--ro-bind-try", "/etc/fonts", "/etc/fonts"]
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.exists(p)]
    return [_bwrap(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", *mounts, "--proc", "/proc", "--dev", "/dev",
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONPATH", os.pathsep.join(paths),
            "--setenv", "HF_HUB_OFFLINE", "1", "--setenv", "HF_DATASETS_OFFLINE", "1",
            "--setenv", "MPLCONFIGDIR", "/tmp",
            "--", sys.executable, "-c", _CHILD.format(True)]


_CHECKED: set[tuple[str, ...]] = set()  # (bwrap, *sys.path) that started Python


def check_scoring_sandbox() -> None:
    """Raise `ScoringSandboxUnavailable` (one line naming why) unless the scoring child's
    sandbox starts Python here (or `UNSANDBOXED_ENV` opts out): called when a mix with a task
    scored in the child is built, so a machine that cannot sandbox refuses at start. Cached per
    process and import path (one sandboxed `python -c pass`, tens of milliseconds)."""
    if _unsandboxed():
        return
    key = (_bwrap(), *sys.path)
    if key in _CHECKED:
        return
    cmd = _sandbox_command()
    cmd[-1] = "import meshrl"  # the binds reach meshrl
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=60, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ScoringSandboxUnavailable(f"scoring sandbox: bwrap cannot start ({e}); untrusted "
                                        f"answers are never scored unsandboxed unless "
                                        f"{UNSANDBOXED_ENV}=1") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise ScoringSandboxUnavailable(f"scoring sandbox: bwrap cannot start Python here "
                                        f"(exit {done.returncode}: {why[0][:200]}); untrusted "
                                        f"answers are never scored unsandboxed unless "
                                        f"{UNSANDBOXED_ENV}=1")
    _CHECKED.add(key)


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
