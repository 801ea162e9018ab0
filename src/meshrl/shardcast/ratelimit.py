"""Upload rate limits: a token bucket with two priority classes (relays before clients).

Tokens are bytes; they accrue at `rate` per second up to `burst`. A taker is granted its bytes
as soon as the balance is positive and nobody of its class or a higher one waits ahead of it;
the balance may then go negative (a debt repaid before the next grant), so any chunk size works
and the long-run rate is exact: over t seconds at most `burst + rate * t` bytes pass. Waiters
are served in order, high class first (strict priority), which shares the rate evenly among
streams that take equal chunks. `high_waited` tells whether the high class had to queue lately:
then the link is saturated by relays and has no spare capacity for clients.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate, self.burst = rate, burst
        self._tokens = 0.0  # starts empty: the rate holds from the first byte
        self._stamp = time.monotonic()
        self._queues: tuple[deque[tuple[asyncio.Future[None], int]], ...] = (deque(), deque())
        self._timer: asyncio.TimerHandle | None = None
        self._last_high_wait = -math.inf

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def high_waited(self, within: float) -> bool:
        """Whether a high-priority taker queued in the last `within` seconds."""
        busy = bool(self._queues[0])
        return busy or time.monotonic() - self._last_high_wait < within

    async def take(self, n: int, high: bool = False, timeout: float | None = None) -> None:
        """Wait until `n` bytes may be sent; TimeoutError after `timeout` s in the queue."""
        now = time.monotonic()
        self._refill(now)
        ahead = self._queues[0] or (not high and self._queues[1])
        if not ahead and self._tokens > 0:
            self._tokens -= n
            return
        if high:
            self._last_high_wait = now
        fut = asyncio.get_running_loop().create_future()
        entry = (fut, n)
        self._queues[0 if high else 1].append(entry)
        self._arm()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if fut.done():  # granted just as the timeout fired: the bytes are ours
                return
            fut.cancel()
            raise
        except BaseException:
            fut.cancel()  # a granted future ignores this; its bytes stay spent
            raise
        finally:
            if high:
                self._last_high_wait = time.monotonic()

    def _arm(self) -> None:
        if self._timer is None and (self._queues[0] or self._queues[1]):
            delay = max(0.0, -self._tokens / self.rate) + 1e-4
            self._timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._refill(time.monotonic())
        while self._tokens > 0:
            queue = self._queues[0] or self._queues[1]
            if not queue:
                break
            fut, n = queue.popleft()
            if fut.done():
                continue
            self._tokens -= n
            fut.set_result(None)
        self._arm()
