"""Held requests: a reader asks once and is answered when there is something, not every poll.

A worker with nothing to make, the trainer waiting for accepted files and a validator waiting
for submissions used to poll: each poll a signed request (a signature recovered, a connection,
a SQL read) that mostly answered "nothing yet", and each wait rounded up to the next poll. With
`wait=S` on `GET /work` or `GET /ledger` the orchestrator holds the request until its answer is
no longer empty, or S seconds (capped by `work.max_hold_s`). `State` rings the `Alarm` after
each change it commits (a file moved, a demand restated, a heartbeat); a held request then
looks again. It also looks every `RECHECK_S` on its own, so a change no write rings for (a
lease of another node running out) is seen within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["RECHECK_S", "Alarm", "hold"]

T = TypeVar("T")
RECHECK_S = 0.1  # s: the longest a held request goes without looking again


class Alarm:
    """Wakes every held request (`wait`) when rung; rung from the event loop's thread or any
    other (a write from a worker thread reaches the loop with `call_soon_threadsafe`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def ring(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # nobody has waited yet: nothing to wake
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._fire()
        else:
            loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> None:
        """Until the next ring or `seconds`, whichever comes first."""
        self._loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), max(0.0, seconds))


async def hold(alarm: Alarm, look: Callable[[], T], ready: Callable[[T], bool],
               seconds: float) -> T:
    """`look()` until `ready` of its answer or `seconds` have passed (the last answer then),
    looking again at each ring of `alarm` and every `RECHECK_S`."""
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        answer = look()
        left = deadline - time.monotonic()
        if ready(answer) or left <= 0:
            return answer
        await alarm.wait(min(left, RECHECK_S))
