"""Counting the requests a web3 client sends to its node (tests of how many round trips a
read costs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from web3.middleware import Web3Middleware


@contextmanager
def sent_requests(w3: Any) -> Iterator[list[str]]:
    """The JSON-RPC requests `w3` sends inside the block, in order: a method name for one
    request, "batch of N" for a batch (outermost middleware: nested requests count too)."""
    sent: list[str] = []

    class Counting(Web3Middleware):
        def wrap_make_request(self, make_request):  # type: ignore[no-untyped-def]
            def middleware(method, params):  # type: ignore[no-untyped-def]
                sent.append(method)
                return make_request(method, params)
            return middleware

        def wrap_make_batch_request(self, make_batch_request):  # type: ignore[no-untyped-def]
            def middleware(requests):  # type: ignore[no-untyped-def]
                sent.append(f"batch of {len(requests)}")
                return make_batch_request(requests)
            return middleware

    w3.middleware_onion.inject(Counting, "counting", layer=0)
    try:
        yield sent
    finally:
        w3.middleware_onion.remove("counting")
