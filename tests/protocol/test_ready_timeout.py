"""`chain.ready_timeout_s`: how long a command waits at start for its JSON-RPC endpoint."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from meshrl.protocol import ChainError
from meshrl.protocol.config import ChainConfig
from meshrl.protocol.local import connect

DEAD_URL = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused


@pytest.mark.timing
@pytest.mark.parametrize("wait_s", [0.2, 1.5])
def test_a_dead_endpoint_is_given_up_on_after_ready_timeout(wait_s: float) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChainError, match=r"127\.0\.0\.1:9"):
        connect(ChainConfig(rpc_url=DEAD_URL, ready_timeout_s=wait_s))
    took = time.monotonic() - t0
    assert wait_s <= took < wait_s + 3.0, took  # waited the whole budget, then gave up


def test_default_and_bounds() -> None:
    assert ChainConfig().ready_timeout_s == 5.0  # what commands waited before it was a knob
    for bad in (0, -1, 601, float("nan")):
        with pytest.raises(ValidationError, match="ready_timeout_s"):
            ChainConfig(ready_timeout_s=bad)
