"""The worker claims its own rewards (worker/claims.py) on a real anvil: locked items wait,
unlocked ones are claimed in batches exactly once and the minted amount is their reward; the
provider key's transactions from two threads of one process never collide on a nonce (the
backend's per-sender lock); a claimer behind a cut link waits it out and claims once it is
back."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

from meshrl.protocol import Protocol, RpcBackend
from meshrl.protocol.anvil import AnvilNode
from meshrl.worker.claims import Claimer
from pool_member import member_in_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from linkrelay import Link

pytestmark = pytest.mark.anvil
TOKEN = 10**18
RATE = 10**15  # reward per work unit
LOCK = 60


@pytest.fixture(scope="module")
def anvil():
    node = AnvilNode()
    backend = node.start()
    yield node, backend
    node.stop()


@pytest.fixture
def pool(anvil):
    """A fresh deployment: a started pool, a provider with its node in it."""
    _, backend = anvil
    m = member_in_pool(backend, LOCK, RATE)
    p, pool, node = m.provider, m.pool, m.node
    return p, pool, node


def _submit(p: Protocol, pool: int, node: str, n: int, units: int = 10, tag: str = "f") -> None:
    for i in range(n):
        p.submit_work(pool, node, f"{tag}{i}-{time.time_ns()}".encode().ljust(32, b"\0")[:32],
                      units)


def test_locked_items_wait_unlocked_ones_are_claimed_in_batches_once(pool) -> None:
    p, pid, node = pool
    _submit(p, pid, node.address, 7)
    claimer = Claimer(p, pid, every_s=1.0, batch=3)
    locked = claimer.claim_once()
    assert (locked.items, locked.amount, locked.txs) == (0, 0, [])
    p.backend.advance_time(LOCK + 1)
    before = p.balance()
    got = claimer.claim_once()
    assert got.items == 7 and len(got.txs) == 3  # 3 + 3 + 1
    assert got.amount == 7 * 10 * RATE == p.balance() - before == claimer.claimed
    assert claimer.claim_once().items == 0  # nothing claimed twice
    assert p.totals()["claimed"] == 7 * 10 * RATE
    with pytest.raises(ValueError):
        Claimer(p, pid, every_s=1.0, batch=65)


def test_two_threads_of_one_process_never_collide_on_the_provider_nonce(pool) -> None:
    """The courier submits while the claimer claims, both as the provider: every transaction
    is mined, none refused for its nonce."""
    p, pid, node = pool
    _submit(p, pid, node.address, 6, tag="early")
    p.backend.advance_time(LOCK + 1)
    start = p.backend.w3.eth.get_transaction_count(p.address)
    errors: list[BaseException] = []
    claimer = Claimer(p, pid, every_s=1.0, batch=2)

    def guarded(fn) -> None:
        try:
            fn()
        except BaseException as e:  # collected: the assertion below names it
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(lambda: _submit(
        p, pid, node.address, 8, tag="late"),)),
        threading.Thread(target=guarded, args=(claimer.claim_once,)),
        threading.Thread(target=guarded, args=(lambda: [p.transfer(node.address, 1)
                                                        for _ in range(6)],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert claimer.items == 6 and claimer.claimed == 6 * 10 * RATE
    assert p.backend.w3.eth.get_transaction_count(p.address) == start + 8 + 3 + 6


def test_a_claimer_behind_a_cut_link_waits_it_out_and_claims(pool, anvil) -> None:
    p, pid, node = pool
    _submit(p, pid, node.address, 2)
    p.backend.advance_time(LOCK + 1)
    # port 0: the link binds a free port itself (one picked and released could be taken)
    link = Link([(("127.0.0.1", 0), ("127.0.0.1", anvil[0].port))]).start()
    port = link.ports[0]
    try:
        far = Protocol(RpcBackend(f"http://127.0.0.1:{port}", timeout=1.0), p.deployment,
                       p.account)
        claimer = Claimer(far, pid, every_s=0.1)
        link.cut()

        async def go() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(claimer.run(stop))
            await asyncio.sleep(2.5)
            assert claimer.claimed == 0 and not task.done()  # waiting, not crashed
            link.restore()
            deadline = time.monotonic() + 30
            while claimer.claimed == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.wait_for(task, 30)
        asyncio.run(go())
    finally:
        link.close()
    assert claimer.items == 2 and claimer.claimed == 2 * 10 * RATE
