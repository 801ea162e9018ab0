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
    request, "batch of N" for a batch (outermost middleware: nested requests count too), and
    a batch the chain client sends through the provider itself (`Backend._raw_batch`, past
    the middleware) counted the same way."""
    sent: list[str] = []
    in_web3 = [False]  # a batch web3 sends reaches the provider too: counted once

    class Counting(Web3Middleware):
        def wrap_make_request(self, make_request):  # type: ignore[no-untyped-def]
            def middleware(method, params):  # type: ignore[no-untyped-def]
                sent.append(method)
                return make_request(method, params)
            return middleware

        def wrap_make_batch_request(self, make_batch_request):  # type: ignore[no-untyped-def]
            def middleware(requests):  # type: ignore[no-untyped-def]
                sent.append(f"batch of {len(requests)}")
                in_web3[0] = True
                try:
                    return make_batch_request(requests)
                finally:
                    in_web3[0] = False
            return middleware

    provider = w3.provider
    raw = getattr(provider, "make_batch_request", None)

    def make_batch_request(requests):  # type: ignore[no-untyped-def]
        if not in_web3[0]:
            sent.append(f"batch of {len(requests)}")
        return raw(requests)  # type: ignore[misc]

    w3.middleware_onion.inject(Counting, "counting", layer=0)
    if raw is not None:
        provider.make_batch_request = make_batch_request
    try:
        yield sent
    finally:
        w3.middleware_onion.remove("counting")
        if raw is not None:
            del provider.make_batch_request
