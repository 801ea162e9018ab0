"""What a worker on a real network retries, and how: every transport failure (the chain's RPC
or a service unreachable, timing out or answering 5xx / 429) is waited out with a doubling
backoff in every phase; what a peer refused on purpose (a revert, a 4xx refusal) is not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from meshrl.log import get_logger, log_event
from meshrl.protocol.claiming import ClaimTooLarge
from meshrl.protocol.errors import ChainError, TxReverted
from meshrl.wire import Transient, WireHTTPError

__all__ = ["retrying", "transient"]

log = get_logger("meshrl.worker")
T = TypeVar("T")


def transient(e: BaseException) -> bool:
    """Whether `e` is the network's doing (worth waiting out), not a refusal."""
    if isinstance(e, TxReverted | ClaimTooLarge):  # the chain's or the endpoint's refusal
        return False
    if isinstance(e, ChainError):
        return True  # RPC transport, a receipt not seen in time, nonce races with another user
    if isinstance(e, WireHTTPError):
        return isinstance(e, Transient)
    return isinstance(e, OSError | TimeoutError)


async def retrying(what: str, fn: Callable[[], Awaitable[T]], stop: asyncio.Event,
                   first_s: float = 1.0, cap_s: float = 30.0) -> T:
    """`await fn()` until it returns; a transient failure is logged and retried after a
    doubling delay (`first_s` .. `cap_s`); anything else, or any failure once `stop` is set,
    is raised."""
    delay = first_s
    while True:
        try:
            return await fn()
        except Exception as e:
            if not transient(e) or stop.is_set():
                raise
            log_event(log, "retrying", phase=what, error=f"{type(e).__name__}: {e}"[:300],
                      in_s=delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(cap_s, delay * 2)
