"""The scoring child's side (`meshrl.tasks.killable` starts it as
`python -c "from meshrl.tasks.scoring_child import main; main()"`): a module of its own, which
no other module imports, because it builds tasks (`meshrl.tasks.sampling`) that themselves
score through `meshrl.tasks.killable`.

Every row of a task whose scorer may run its text (`Task.runs_answer_code`: math-verify,
reasoning-gym datasets whose source can evaluate text, verifiers environments) is scored in a
process forked for it, which answers on a pipe of its own and exits: a row's code (sympy's
`parse_expr` runs what it is given) cannot patch the scorer for the rows after it, nor write to
the parent's pipe; it cannot ptrace this process (not dumpable). In the sandbox, after each row
every other process in it (a row's lingering child) is killed and `/tmp` emptied, so the next
row meets the state the task's build left."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import shutil
import signal
import sys
import time
from typing import Any

from meshrl.tasks.base import Problem
from meshrl.tasks.killable import MEMORY_BYTES, _score_in_process

__all__ = ["main"]


def _die_with_parent() -> None:
    """SIGKILL this child when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`): a parent
    killed while a row hangs must not leave sympy running. (Also fired by the exit of the
    parent's thread that started it: the parent then asks the row again, `math_verify`.)"""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("MESHRL_SCORER_PARENT", os.getppid())):
        os._exit(0)  # the parent died before the signal was armed


def _cap_memory(hard: bool = False) -> None:
    """Cap this child's address space at its size now plus `MEMORY_BYTES` (a soft limit, so
    it can be raised again after a task's build, which is not a row's memory; `hard`: lift
    the cap to the hard limit for a build)."""
    top = resource.getrlimit(resource.RLIMIT_AS)[1]
    with contextlib.suppress(ValueError, OSError, StopIteration), \
            open("/proc/self/status") as f:
        vm = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmSize:"))
        want = top if hard else vm + MEMORY_BYTES
        if top != resource.RLIM_INFINITY:
            want = min(want, top)
        resource.setrlimit(resource.RLIMIT_AS, (want, top))


def _build_task(spec: dict[str, Any], path: list[str]) -> Any:
    """The task of config `spec`, built here as every role builds it (`TasksConfig`); `path`
    is the parent's import path now (an environment package it imports)."""
    from pydantic import TypeAdapter

    from meshrl.tasks import base
    from meshrl.tasks.sampling import TaskSpec

    base.SCORING_ONLY = True  # tasks built here score, never run a tool
    for p in reversed(path):
        if p not in sys.path:
            sys.path.insert(0, p)
    return TypeAdapter(TaskSpec).validate_python(spec).build()


def _task_score(task: Any, req: dict[str, Any]) -> float:
    name, prompt, answer, meta = req["p"]
    try:
        score = float(task.score(Problem(str(name), str(prompt), str(answer), dict(meta)),
                                 str(req["c"])))
    except Exception:  # a scorer failing on a hostile answer: a wrong answer, not a crash
        return 0.0
    return min(1.0, max(0.0, score)) if score == score else 0.0


# trusted answers in the common forms (a number, a fraction, an expression, LaTeX and not),
# scored before the first row so no row's fork pays for math-verify's first use of each
_WARM = [("1", "$1$"), ("1/2", "So the answer is $\\boxed{\\frac{1}{2}}$."),
         ("x^2+1", "The answer is \\boxed{x^2 + 1}"), ("0.25", "\\boxed{\\sqrt{2}}"),
         ("\\frac{3}{4}", "so $\\frac{3}{4}$")]


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: a row's process (same user) may not ptrace or write this one's
    memory through /proc, so it cannot patch the scorer of later rows."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE


def _row(task: Any, req: dict[str, Any]) -> float:
    try:
        if req.get("op") == "score":
            return _task_score(task, req)
        return _score_in_process(str(req["a"]), str(req["c"]), float(req["t"]))
    except MemoryError:  # past the cap: unscorable like a row past its deadline
        return 0.0


def _warm_scorer(task: Any) -> None:
    """Score one of the task's own problems with its reference answer here (trusted text): the
    scorer's lazy imports and caches are then built once and shared by every row's fork."""
    import random

    with contextlib.suppress(Exception):
        p = task.sample(random.Random(0))
        task.score(p, f"<answer>{p.answer}</answer>")


def _forked_row(task: Any, req: dict[str, Any]) -> float | None:
    """The row's score from a process forked for it (None: it died without one)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the row's process: never returns
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)  # the parent's pipes are not the row's to read or write
            os.dup2(null, 1)
            os.setpgid(0, 0)
            os.write(w, json.dumps({"s": _row(task, req)}).encode() + b"\n")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)  # what the row started in its group
    os.set_blocking(r, False)
    data = b""
    with contextlib.suppress(OSError):  # empty: it died before writing
        data = os.read(r, 4096)
    os.close(r)
    try:
        score = float(json.loads(data.partition(b"\n")[0])["s"])
    except (ValueError, KeyError, TypeError):
        return None
    # the row's own code wrote it: out of range is a hostile row's 0, never the machine's fault
    return score if 0.0 <= score <= 1.0 else 0.0


def _mounts_below_tmp() -> list[str]:
    """The mount points under /tmp (the sandbox's binds of directories that live there)."""
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return []
    return [p for p in points if p.startswith("/tmp/")]


def _sweep() -> bool:
    """Kill every process of the sandbox but bwrap's init (1) and this one; empty `/tmp`.
    False when processes keep appearing (the caller exits; the parent starts a fresh sandbox)."""
    me = os.getpid()
    for _ in range(50):
        others = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, me)]
        if not others:
            break
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.001)
    else:
        return False
    bound = _mounts_below_tmp()
    for name in os.listdir("/tmp"):
        path = os.path.join("/tmp", name)
        if any(m == path or m.startswith(path + "/") for m in bound):
            continue  # a read-only bind of the import path (a checkout under /tmp)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return True


def main(sandboxed: bool = False) -> None:
    """The child: imports math-verify, caps its address space, says "ready", then answers one
    JSON line per request line until its stdin closes: a math-verify row (`a`, `c`, `t`), a
    task to build (`op` "build": answers `built` or `error`) or a row of a built task (`op`
    "score"), each row in a process of its own. `sandboxed`: it runs in the bubblewrap sandbox
    of `meshrl.tasks.killable` (its own pid namespace and `/tmp`, swept after each row)."""
    import math_verify  # noqa: F401  (before "ready": importing is not a row's time)

    _die_with_parent()
    _not_dumpable()
    for gold, said in _WARM:  # its lazy imports, parsers and caches, built once and shared
        _score_in_process(gold, said, 5.0)
    _cap_memory()
    gc.freeze()  # the imports' objects stay shared with each row's fork (no copy on write)
    tasks: dict[str, Any] = {}
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for raw in sys.stdin.buffer:
        req: dict[str, Any] = json.loads(raw)
        op = req.get("op")
        reply: dict[str, Any]
        if op == "build":
            _cap_memory(hard=True)
            try:
                tasks[req["k"]] = task = _build_task(req["spec"], list(req.get("path", [])))
                _warm_scorer(task)
                reply = {"built": req["k"]}
            except Exception as e:  # the parent raises VerifierUnavailable with this line
                reply = {"error": f"{type(e).__name__}: {e}"[:500]}
            _cap_memory()
            gc.freeze()
        else:
            task = tasks[req["k"]] if op == "score" else None
            if task is not None:
                with contextlib.suppress(Exception):  # trusted work (no completion): shared
                    task.warm(Problem(*map(str, req["p"][:3]), dict(req["p"][3])))
            if task is not None and not task.runs_answer_code():
                s = _row(task, req)  # a scorer that runs no text: no row can change it
            else:
                s = _forked_row(task, req)
            if s is None or (sandboxed and not _sweep()):
                os._exit(0)  # the parent asks again in a fresh child (then scores it 0)
            reply = {"s": s}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
