"""The scoring child's side (`meshrl.tasks.killable` starts it as
`python -c "from meshrl.tasks.scoring_child import main; main()"`): a module of its own, which
no other module imports, because it builds tasks (`meshrl.tasks.sampling`) that themselves
score through `meshrl.tasks.killable`."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
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

    from meshrl.tasks.sampling import TaskSpec

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


def main() -> None:
    """The child: imports math-verify, caps its address space, says "ready", then answers one
    JSON line per request line until its stdin closes: a math-verify row (`a`, `c`, `t`), a
    task to build (`op` "build": answers `built` or `error`) or a row of a built task (`op`
    "score")."""
    import math_verify  # noqa: F401  (before "ready": importing is not a row's time)

    _die_with_parent()
    _cap_memory()
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
                tasks[req["k"]] = _build_task(req["spec"], list(req.get("path", [])))
                reply = {"built": req["k"]}
            except Exception as e:  # the parent raises VerifierUnavailable with this line
                reply = {"error": f"{type(e).__name__}: {e}"[:500]}
            _cap_memory()
        else:
            try:
                if op == "score":
                    s = _task_score(tasks[req["k"]], req)
                else:
                    s = _score_in_process(str(req["a"]), str(req["c"]), float(req["t"]))
            except MemoryError:  # past the cap: unscorable like a row past its deadline
                s = 0.0
            reply = {"s": s}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
