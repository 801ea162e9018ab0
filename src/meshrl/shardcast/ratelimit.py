"""Upload rate limits: a token bucket with two priority classes (relays before clients).

Tokens are bytes; they accrue at `rate` per second up to `burst`. A taker is granted its bytes
as soon as the balance is positive and nobody of its class or a higher one waits; the balance
may then go negative (a debt repaid before the next grant), so any chunk size works and the
long-run rate is exact: over t seconds at most `burst + rate * t` bytes pass (the bucket starts
empty). Waiters are served high class first (strict priority); within the high class in arrival
order, which shares the rate evenly among streams taking equal chunks; within the low class by
`rank` plus `AGING` per second of arrival time (lowest first): a server ranks clients by the
fraction of the version they already hold, so the one furthest behind is served first and all
finish close together, while a client ahead by 10% waits at most about 0.5 s. A low taker's
`timeout` counts only while the high class is being served: it is for clients starved by relays,
not by each other. `high_waited` tells whether the high class had to queue lately: then relays
saturate the link and there is no spare capacity for clients.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time

__all__ = ["TokenBucket"]

_Waiter = tuple[float, int, asyncio.Future[None], int]  # key, arrival, future, bytes
AGING = 0.2  # rank per second of waiting: no low waiter starves for long behind lower ranks


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
        self._high_grants = 0

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def high_waited(self, within: float) -> bool:
        """Whether a high-priority taker queued in the last `within` seconds."""
        busy = any(not w[2].done() for w in self._queues[0])
        return busy or time.monotonic() - self._last_high_wait < within

    async def take(self, n: int, high: bool = False, timeout: float | None = None,
                   rank: float = 0.0) -> None:
        """Wait until `n` bytes may be sent; TimeoutError after `timeout` s in the queue during
        which high takers were granted bytes (low takers only: relays starve it)."""
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
                       (0.0 if high else rank + AGING * now, next(self._seq), fut, n))
        self._arm()
        try:
            while True:
                grants = self._high_grants
                try:
                    await asyncio.wait_for(asyncio.shield(fut), timeout)
                    return
                except TimeoutError:
                    if fut.done():  # granted just as the timeout fired: the bytes are ours
                        return
                    if self._high_grants == grants:  # behind other clients only: wait on
                        continue
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
            self._high_grants += queue is self._queues[0]
            fut.set_result(None)
        self._arm()
