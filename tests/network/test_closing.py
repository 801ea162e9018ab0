"""A draining pool keeps its chain up until its members' rewards are claimed (network/closing.py)
on a real anvil, read as `network up` reads it (`meshrl chain works`, a process): rewards still
locked hold the chain open; once they unlock, a member that claims (the worker's own claimer)
ends the drain; a member that does not is given the stated window, and what is left is said
(events and stdout); a further signal ends it at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from meshrl.network.closing import drain, mine, rewards_left
from meshrl.network.report import works_history
from meshrl.protocol.anvil import AnvilNode
from meshrl.worker.claims import Claimer
from pool_member import member_in_pool

pytestmark = pytest.mark.anvil
TOKEN, RATE, LOCK = 10**18, 10**15, 8


@pytest.fixture(scope="module")
def anvil_backend():
    node = AnvilNode()
    yield node.start()
    node.stop()


@pytest.fixture
def member(anvil_backend, tmp_path):
    """A pool on the session's anvil with one member's 3 items, locked for LOCK seconds."""
    backend = anvil_backend
    m = member_in_pool(backend, LOCK, RATE)
    p, pool, node, dep = m.provider, m.pool, m.node, m.deployment
    for i in range(3):
        p.submit_work(pool, node.address, f"c{i}-{time.time_ns()}".encode().ljust(32)[:32], 10)
    dep_file = tmp_path / "deployment.json"
    dep.save(dep_file)
    info = {"rpc_url": backend.url, "deployment": str(dep_file), "pool_id": pool}
    return p, pool, info


def _said() -> tuple[list[tuple[str, dict[str, Any]]], Any]:
    said: list[tuple[str, dict[str, Any]]] = []
    return said, lambda what, fields: said.append((what, fields))


def test_locked_rewards_hold_the_chain_until_the_member_claims_them(member) -> None:
    p, pool, info = member
    said, say = _said()
    stop = threading.Event()
    claimer = Claimer(p, pool, every_s=1.0)

    def claim() -> None:  # the member's worker, claiming on its own schedule
        while not stop.wait(1.0):
            claimer.claim_once()
    t = threading.Thread(target=claim, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        how = drain(lambda: works_history(info), window_s=600, max_s=120,
                    stopped=lambda: False, say=say, tick=lambda: mine(info["rpc_url"]),
                    every_s=1.0)
    finally:
        stop.set()
        t.join(10)
    assert how == "claimed"
    assert time.monotonic() - t0 >= 1.0  # it waited for the unlock, not a moment
    closing, closed = said[0][1], said[-1][1]
    assert said[0][0] == "closing" and closing["unclaimed_items"] == 3
    assert closing["close_at"] >= closing["last_unlock"] + 600
    assert p.address.lower() in closing["providers"] and "meshrl chain claim" in \
        closing["members"]
    assert said[-1][0] == "closed" and closed["unclaimed_items"] == 0 and claimer.items == 3
    assert p.balance() > 0


def test_unclaimed_rewards_get_the_window_then_what_is_left_is_said(member) -> None:
    _, _, info = member
    said, say = _said()
    how = drain(lambda: works_history(info), window_s=2, max_s=120, stopped=lambda: False,
                say=say, tick=lambda: mine(info["rpc_url"]), every_s=1.0)
    left = rewards_left(works_history(info))
    assert how == "window over" and left is not None and left.items == 3
    assert time.time() >= said[0][1]["close_at"]  # the last unlock + the window passed
    closed = said[-1][1]
    assert closed["unclaimed_items"] == 3 and "network up" in closed["members"]


def test_a_further_signal_ends_the_drain_at_once(member) -> None:
    _, _, info = member
    said, say = _said()
    t0 = time.monotonic()
    how = drain(lambda: works_history(info), window_s=600, max_s=120, stopped=lambda: True,
                say=say, tick=lambda: None)
    assert how == "interrupted" and time.monotonic() - t0 < 60
    assert said[-1][1]["unclaimed_items"] == 3 and "meshrl chain claim" in \
        said[-1][1]["members"]
