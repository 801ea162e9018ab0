"""Reading a rollout file nobody vouches for, in a child process: a file that crashes, stalls or
floods the Parquet reader costs that child, never the caller.

The limits of `read_rollout_file` are checked before anything is decompressed, but the Parquet
library itself can abort the whole process on a corrupted footer (a single flipped byte did,
inside its metadata accessors: `tests/wire/test_hostile_files.py`). So roles that read files
from untrusted workers parse them in a child forked from a server that has already imported the
reader (`multiprocessing` "forkserver": a few tens of milliseconds per file), with a wall-clock
deadline and an address-space cap. Whatever goes wrong there comes back as a
`RolloutFileError` naming what happened (a signal, the deadline, the memory cap), so the caller
judges the file instead of dying on it, and the next restart does not meet it again.

`iter_rollout_files_isolated` reads several files in one child (one fork, not one a file: the
trainer reads a step's files together) and hands them back one at a time: the child sends each
file as soon as it is read and keeps none (it used to hold a whole batch and send it at once:
8 files' worth of memory in the child and the pipe, issue #41), and its memory cap bounds one
file's read. If that child dies, stalls or hits its cap, each file it did not answer for is
read again in a child of its own, so a hostile file costs only itself.
`read_rollout_files_isolated` is the same as a list.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import resource
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from meshrl.wire.errors import RolloutFileError
from meshrl.wire.rollout_file import FileLimits, RolloutFile, read_rollout_file

__all__ = ["IsolationLimits", "iter_rollout_files_isolated", "read_rollout_file_isolated",
           "read_rollout_files_isolated"]

_CTX: Any = None


@dataclass(frozen=True)
class IsolationLimits:
    """Deadline and memory of one isolated read (on top of the file's `FileLimits`)."""

    seconds: float = 60.0
    memory_bytes: int = 2 << 30


def _main_module() -> list[str]:
    """The caller's main module when it was started with `-m` (`meshrl.cli`): every child runs
    it again (`multiprocessing.spawn.prepare`); preloaded, its imports are done once in the
    fork server instead of once a child (a fifth of each child's CPU in a profile of the
    demo's trainer)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    return [name] if isinstance(name, str) and not name.endswith("__main__") else []


def _context() -> Any:
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["meshrl.wire.rollout_file", *_main_module()])
        _CTX = ctx
    return _CTX


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(conn: Connection, data: bytes, limits: FileLimits, memory_bytes: int) -> None:
    # the cap counts what this read may add to the address space the reader already holds
    cap = _vm_bytes() + memory_bytes
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        conn.send(("ok", read_rollout_file(data, limits)))
    except RolloutFileError as e:
        conn.send(("refused", str(e)))
    except MemoryError:
        conn.send(("refused", f"reading it needs more than {memory_bytes} bytes of memory"))
    finally:
        conn.close()


def _child_many(conn: Connection, datas: list[bytes], limits: FileLimits,
                memory_bytes: int) -> None:
    cap = _vm_bytes() + memory_bytes
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        for data in datas:  # one file at a time, sent and dropped before the next is read
            try:
                out: tuple[str, Any] = ("ok", read_rollout_file(data, limits))
            except RolloutFileError as e:
                out = ("refused", str(e))
            conn.send(out)
            del out
    finally:  # a MemoryError sends nothing more: the parent reads the rest alone
        conn.close()


def iter_rollout_files_isolated(datas: list[bytes], limits: FileLimits | None = None,
                                isolation: IsolationLimits | None = None,
                                ) -> Iterator[RolloutFile | RolloutFileError]:
    """`read_rollout_file` of each of `datas` in one child process, yielded in order as each is
    read (the deadline is `isolation.seconds` per file); each result is the file or its
    refusal. When the shared child stops answering (a crash, the deadline, the cap), every file
    it did not answer for is read again alone by `read_rollout_file_isolated`, so one hostile
    file cannot cost the others."""
    limits, isolation = limits or FileLimits(), isolation or IsolationLimits()
    if len(datas) <= 1:
        yield from (_one(d, limits, isolation) for d in datas)
        return
    done = 0
    with _reader(_child_many, datas, limits, isolation.memory_bytes) as (parent, _):
        while done < len(datas) and parent.poll(isolation.seconds):
            try:
                kind, value = parent.recv()
            except (EOFError, OSError):
                break
            yield value if kind == "ok" else RolloutFileError(value)
            done += 1
    yield from (_one(d, limits, isolation) for d in datas[done:])


def read_rollout_files_isolated(datas: list[bytes], limits: FileLimits | None = None,
                                isolation: IsolationLimits | None = None,
                                ) -> list[RolloutFile | RolloutFileError]:
    """`iter_rollout_files_isolated` as a list."""
    return list(iter_rollout_files_isolated(datas, limits, isolation))


def _one(data: bytes, limits: FileLimits, isolation: IsolationLimits,
         ) -> RolloutFile | RolloutFileError:
    try:
        return read_rollout_file_isolated(data, limits, isolation)
    except RolloutFileError as e:
        return e


def read_rollout_file_isolated(data: bytes, limits: FileLimits | None = None,
                               isolation: IsolationLimits | None = None) -> RolloutFile:
    """`read_rollout_file(data, limits)` in a child process; a crash, a stall past the
    deadline or the memory cap is a `RolloutFileError` like any malformed file."""
    limits, isolation = limits or FileLimits(), isolation or IsolationLimits()
    if len(data) > limits.max_bytes:  # no need to ship it to a child to refuse it
        raise RolloutFileError(f"file of {len(data)} bytes > limit {limits.max_bytes}")
    with _reader(_child, data, limits, isolation.memory_bytes) as (parent, proc):
        if not parent.poll(isolation.seconds):
            raise RolloutFileError(f"reading the file took longer than {isolation.seconds:g} s")
        try:
            kind, value = parent.recv()
        except (EOFError, OSError):
            proc.join(5)
            raise RolloutFileError(f"the reader died reading the file ({_death(proc)})") \
                from None
    if kind == "ok":
        return value  # type: ignore[no-any-return]
    raise RolloutFileError(value)


@contextlib.contextmanager
def _reader(target: Any, *args: Any) -> Iterator[tuple[Any, Any]]:
    """A child process running `target(conn, *args)`; yields (the parent's end of its pipe, the
    process), and kills, reaps and closes both however the block ends."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    child.close()
    try:
        yield parent, proc
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()


def _death(proc: Any) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"
