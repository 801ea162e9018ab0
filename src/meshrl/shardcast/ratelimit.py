"""Upload rate limits: a token bucket with two priority classes (relays before clients).

Tokens are bytes; they accrue at `rate` per second up to `burst`. A taker is granted its bytes
as soon as the balance is positive and nobody of its class or a higher one waits; the balance
may then go negative (a debt repaid before the next grant), so any chunk size works and the
long-run rate is exact: over t seconds at most `burst + rate * t` bytes pass (the bucket starts
empty). Waiters are served high class first (strict priority); within the high class in arrival
order, which shares the rate evenly among streams taking equal chunks; within the low class by
`rank` (lowest first, then arrival): a server ranks clients by the fraction of the version they
already hold, so the one furthest behind is served first and all finish close together.
`high_waited` tells whether the high class had to queue lately: then relays saturate the link
and there is no spare capacity for clients.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time

__all__ = ["TokenBucket"]

_Waiter = tuple[float, int, asyncio.Future[None], int]  # rank, arrival, future, bytes


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate, self.burst = rate, burst
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self._queues: tuple[list[_Waiter], list[_Waiter]] = ([], [])  # high, low (heaps)
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._last_high_wait = -math.inf

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def high_waited(self, within: float) -> bool:
        """Whether a high-priority taker queued in the last `within` seconds."""
        busy = any(not w[2].done() for w in self._queues[0])
        return busy or time.monotonic() - self._last_high_wait < within

    async def take(self, n: int, high: bool = False, timeout: float | None = None,
                   rank: float = 0.0) -> None:
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
        heapq.heappush(self._queues[0 if high else 1],
                       (0.0 if high else rank, next(self._seq), fut, n))
        self._arm()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if fut.done():  # granted just as the timeout fired: the bytes are ours
                return
            fut.cancel()  # dropped from the queue when it reaches the head
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
            _, _, fut, n = heapq.heappop(queue)
            if fut.done():
                continue
            self._tokens -= n
            fut.set_result(None)
        self._arm()
