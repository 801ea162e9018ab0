"""What the worker waits out (transport failures) and what it does not (refusals), and its live
status line."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import pytest

from meshrl.protocol.errors import ChainError, TxReverted
from meshrl.wire.errors import WireUnavailable, refusal
from meshrl.worker.join import ClockSkew, check_clock
from meshrl.worker.retry import retrying, transient
from meshrl.worker.status import StatusLine, status_text


def test_transient_is_the_network_not_a_refusal() -> None:
    assert transient(ChainError("rpc down")) and transient(WireUnavailable("x"))
    assert transient(TimeoutError()) and transient(ConnectionResetError())
    assert transient(refusal(503, "", "", "busy")) and transient(refusal(429, "", "", "slow"))
    assert not transient(TxReverted("stake: below minimum"))
    assert not transient(refusal(403, "not_in_pool", "", "no"))
    assert not transient(ValueError("a bug"))


def test_retrying_waits_out_transport_errors_and_raises_refusals() -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ChainError("link down")
        return "done"

    async def refused() -> None:
        raise TxReverted("pools: node blacklisted")

    stop = asyncio.Event()
    assert asyncio.run(retrying("x", flaky, stop, first_s=0.01)) == "done" and len(calls) == 3
    with pytest.raises(TxReverted):
        asyncio.run(retrying("x", refused, stop, first_s=0.01))


def test_clock_check() -> None:
    check_clock(120.0, 300)
    check_clock(-250.0, 300, margin_s=30)
    with pytest.raises(ClockSkew) as e:
        check_clock(-400.0, 300)
    assert e.value.offset_s == -400.0 and "-400 s off" in str(e.value)


def test_status_line_redraws_one_line() -> None:
    node = SimpleNamespace(state="working", pool_step=4, files_done=7,
                           policy=SimpleNamespace(version=3))
    rewards = {"works": [{"status": "submitted"}] * 6 + [{"status": "hard_invalidated"}],
               "rewards": {"earned": 15 * 10**17, "claimable": 0, "claimed": 5 * 10**17}}
    text = status_text(node, rewards)
    assert text == ("working | step 4 | policy v3 | files sent 7, on chain 6, invalidated 1 | "
                    "earned 1.5000 tokens, claimable 0.0000, claimed 0.5000")
    out = io.StringIO()
    line = StatusLine(out, enabled=True)
    stop = asyncio.Event()

    async def run() -> None:
        task = asyncio.create_task(line.run(node, lambda: rewards, stop, every_s=0.01))
        for _ in range(500):  # two redraws (a loaded machine takes its time)
            if out.getvalue().count("\r\x1b[2K") >= 2:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
    asyncio.run(run())
    assert out.getvalue().count("\r\x1b[2K") >= 2 and out.getvalue().endswith("\n")
    assert "\n" not in out.getvalue()[:-1]  # one line, redrawn in place
    quiet = io.StringIO()
    StatusLine(quiet, enabled=False).show("x")
    assert quiet.getvalue() == ""
