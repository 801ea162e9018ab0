"""Blocking calls a stop may abandon, each in a daemon thread of its own (the roles' processes:
worker, validator).

`asyncio.to_thread` runs on the loop's default executor, whose threads `asyncio.run` and the
interpreter's exit both wait for: a chain read of minutes over a slow link (the claimer's, the
status line's), a policy load or a file's generation still running when SIGTERM came held the
worker 54-81 s after its `stopped` line. A daemon thread is not waited for: the coroutine
awaiting it is cancelled with the rest at the stop. A process whose detached calls are still
running when its work is done leaves through `exit_now` (an interpreter finalizing under a
running torch kernel aborted, SIGABRT).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["detached", "exit_now", "running"]

T = TypeVar("T")
_running = 0  # detached calls not finished
_lock = threading.Lock()


def running() -> int:
    """Detached calls still running."""
    return _running


def exit_now(code: int) -> None:
    """End a role's process with `code` at once, once its node has stopped (its `stopped` line
    logged, what it keeps on disk): output flushed, no wait for detached calls still running
    (an interpreter finalizing under a running torch kernel aborted, SIGABRT), for the
    default executor's threads, or for the interpreter's last garbage collection of a model's
    heap (2-7 s of a trainer's stop)."""
    import logging
    import os
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def detached(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a new daemon thread; its result or its exception, here."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():  # cancelled meanwhile: nobody waits for it
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        global _running
        try:
            result, error = fn(*args), None
        except BaseException as e:  # handed to the awaiting coroutine
            result, error = None, e
        finally:
            with _lock:
                _running -= 1
        with contextlib.suppress(RuntimeError):  # a closed loop: the process is stopping
            loop.call_soon_threadsafe(settle, result, error)

    global _running
    with _lock:
        _running += 1
    threading.Thread(target=run, name=f"detached-{getattr(fn, '__name__', 'call')}",
                     daemon=True).start()
    return await fut
