"""The delivery phase machine against a real in-process chain (eth-tester): a stale file is
dropped unsubmitted, a file already on chain (a crash after the transaction) is finished without
a second submission, and a duplicate revert counts as submitted."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from eth_account import Account

from meshrl.protocol import EthTesterBackend, Protocol, ProtocolParams, deploy
from meshrl.protocol.signing import sign_invite
from meshrl.worker.courier import ChainCourier
from meshrl.worker.delivery import DuplicateSubmission, deliver
from meshrl.worker.outbox import Outbox, OutboxEntry
from rpc_requests import sent_requests

TOKEN = 10**18


def _pool():
    backend = EthTesterBackend()
    fed, mgr, prov, node = (Account.create() for _ in range(4))
    for a in (fed, mgr, prov, node):
        backend.fund(a.address, 10**21)
    dep = deploy(backend, fed, ProtocolParams(min_stake=10 * TOKEN, stake_per_unit=TOKEN))
    chain = Protocol(backend, dep, fed)
    pool = chain.create_pool(chain.create_domain("d"), mgr.address, 1)
    chain.start_pool(pool)
    chain.mint(prov.address, 100 * TOKEN)
    p = chain.as_(prov)
    p.register_provider(20 * TOKEN)
    p.add_node(node, 1)
    expiry = backend.w3.eth.get_block("latest")["timestamp"] + 3600
    sig = sign_invite(mgr.key, dep.protocol, backend.chain_id, chain.pool(pool).domain, pool,
                      node.address, chain.node_generation(node.address), 1, expiry)
    chain.as_(node).join_pool(pool, node.address, 1, expiry, sig)
    return chain, pool, prov, node


def _entry(box: Outbox, data: bytes, version: int) -> OutboxEntry:
    e = OutboxEntry(hashlib.sha256(data).hexdigest(), len(data), counter=0,
                    policy_version=version, work_units=10)
    return box.put(data, e)


def test_stale_dropped_and_submitted_once(tmp_path):
    chain, pool, prov, node = _pool()
    box = Outbox(tmp_path)
    courier = ChainCourier(None, chain, prov, node.address, pool, box)  # type: ignore[arg-type]
    stale = _entry(box, b"old", version=1)
    assert asyncio.run(deliver(box, stale, courier, pool_step=4, async_level=2)) == "dropped"
    assert box.dropped()[0]["reason"] == "policy version 1 < step 4 - async_level 2"
    # on chain already, recorded only as uploaded (a crash right after the transaction)
    done = _entry(box, b"sent before the crash", version=3)
    box.mark(done, "uploaded")
    asyncio.run(courier.submit(done))
    box = Outbox(tmp_path)  # the process restarted: the chain is asked, and says it is there
    courier = ChainCourier(None, chain, prov, node.address, pool, box)  # type: ignore[arg-type]
    with sent_requests(chain.backend.w3) as sent:
        assert asyncio.run(deliver(box, box.pending()[0], courier, pool_step=4,
                                   async_level=2)) == "sent"
    assert sent == ["eth_call"]  # the work item's status; no transaction
    subs = [e for e in chain.events().poll() if e.name == "WorkSubmitted"]
    assert len(subs) == 1 and box.pending() == []
    with pytest.raises(DuplicateSubmission, match="duplicate file"):
        asyncio.run(courier.submit(done))


class Recording(ChainCourier):
    """The real courier, its uploads skipped (no orchestrator here) and its questions counted."""

    asked = 0

    async def upload(self, entry: OutboxEntry, path) -> None:  # type: ignore[no-untyped-def]
        return None

    async def submitted(self, entry: OutboxEntry) -> bool:
        self.asked += 1
        return await super().submitted(entry)


def test_a_file_this_process_never_sent_is_not_asked_about(tmp_path):
    """A file put by this process is submitted without first asking the chain whether it is
    there (nothing else could have submitted it: a view call per file saved); once its
    submission was sent, a retry asks (the transaction may be on chain unrecorded)."""
    chain, pool, prov, node = _pool()
    box = Outbox(tmp_path)
    courier = Recording(None, chain, prov, node.address, pool, box)  # type: ignore[arg-type]
    fresh = _entry(box, b"fresh", version=3)
    assert asyncio.run(deliver(box, fresh, courier, pool_step=4, async_level=2)) == "sent"
    assert courier.asked == 0 and fresh.sha256 not in box.unsent
    assert [r["sha256"] for r in box.sent()] == [fresh.sha256]
    assert Outbox(tmp_path).sent() == box.sent()  # kept in memory as on disk
    stale = _entry(box, b"stale, never sent", version=1)
    assert asyncio.run(deliver(box, stale, courier, pool_step=4, async_level=2)) == "dropped"
    assert courier.asked == 0
    tried = _entry(box, b"sent, then the link failed", version=3)
    box.mark(tried, "uploaded")
    box.sending(tried)
    asyncio.run(courier.submit(tried))  # on chain, the outbox not told
    assert asyncio.run(deliver(box, tried, courier, pool_step=4, async_level=2)) == "sent"
    assert courier.asked == 1  # asked, found, not sent again
    subs = [e for e in chain.events().poll() if e.name == "WorkSubmitted"]
    assert len(subs) == 2
