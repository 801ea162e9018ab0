"""Held requests: a reader asks once and is answered when there is something, not every poll.

A worker with nothing to make, the trainer waiting for accepted files and a validator waiting
for submissions used to poll: each poll a signed request (a signature recovered, a connection,
a SQL read) that mostly answered "nothing yet", and each wait rounded up to the next poll. With
`wait=S` on `GET /work` or `GET /ledger` the orchestrator holds the request until its answer is
no longer empty, or S seconds (capped by `work.max_hold_s`). `State` rings the `Alarm` after
each change it commits (a file moved, a demand restated, a heartbeat); a held request then
looks again. It also looks every `RECHECK_S` on its own, so a change no write rings for (a
lease of another node running out) is seen within that time.

What held requests may cost (docs/services.md): each holds a coroutine, a connection and a look
per ring, so `HoldGate` caps how many one signer and one source IP may have held at once (the
extra are refused `429 too_many_held`, with the cap as the reason). A held ledger read looks
only when the ledger changed (its own alarm, `State.files_alarm`, not rung by heartbeats), and
every held read of the same query shares one SQL read per change (api.py): a hundred waiting
readers cost one query per change, not a hundred every `RECHECK_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from meshrl.wire.errors import ErrorCode, WireError

__all__ = ["RECHECK_S", "Alarm", "HoldGate", "hold"]

T = TypeVar("T")
RECHECK_S = 0.1  # s: the longest a held request goes without looking again


class Alarm:
    """Wakes every held request (`wait`) when rung; rung from the event loop's thread or any
    other (a write from a worker thread reaches the loop with `call_soon_threadsafe`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.generation = 0  # rings so far: an answer looked up at one generation still holds

    def ring(self) -> None:
        self.generation += 1
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
               seconds: float, recheck_s: float = RECHECK_S) -> T:
    """`look()` until `ready` of its answer or `seconds` have passed (the last answer then),
    looking again at each ring of `alarm` and every `recheck_s`."""
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        answer = look()
        left = deadline - time.monotonic()
        if ready(answer) or left <= 0:
            return answer
        await alarm.wait(min(left, recheck_s))


class HoldGate:
    """Counts the requests held now, per signer and per source IP; `admit` refuses one past
    either cap (`TOO_MANY_HELD`) before it is held."""

    def __init__(self, per_signer: int, per_ip: int) -> None:
        self.per_signer, self.per_ip = per_signer, per_ip
        self._held: dict[str, int] = {}  # "a:<address>" / "ip:<peer>" -> held now

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    @contextlib.contextmanager
    def admit(self, signer: str, peer: str) -> Iterator[None]:
        keys = (f"a:{signer.lower()}", f"ip:{peer}")
        if self.held(keys[0]) >= self.per_signer:
            raise WireError(ErrorCode.TOO_MANY_HELD, f"this address has {self.per_signer} "
                            "held requests already: ask again when one is answered")
        if self.held(keys[1]) >= self.per_ip:
            raise WireError(ErrorCode.TOO_MANY_HELD, f"this IP address has {self.per_ip} "
                            "held requests already: ask again when one is answered")
        for k in keys:
            self._held[k] = self.held(k) + 1
        try:
            yield
        finally:
            for k in keys:
                left = self._held[k] - 1
                if left:
                    self._held[k] = left
                else:
                    del self._held[k]  # no entry left behind: the table holds only the held
