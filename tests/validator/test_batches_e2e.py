"""Batched submission end to end (issue 46), real processes on loopback: anvil, discovery, an
orchestrator whose pool's rules batch 2 files, an honest and a forging `meshrl worker`, one
`meshrl validator`. Each worker submits its files as one batch (one `submit_batch`) after
posting its leaves to the orchestrator; the validator reads the leaves, judges each file,
accepts the honest ones (nothing on chain) and takes the forged file out of its batch with a
hard verdict (`open_leaf`): the cheater is slashed, its batch wiped, the honest batch stays
claimable and is claimed as one item. The orchestrator's books and the chain's own reading
(`pool_history`) agree on every node's money."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from meshrl.protocol import Standing, WorkStatus
from meshrl.protocol.history import pool_history, provider_rewards
from meshrl.wire import NoSuchBatch, SignedClient
from meshrl.wire.models import BatchInfo, PoolNodes
from meshrl.worker.claims import Claimer
from network import (
    PARAMS,
    RULES,
    Net,
    _rows,
    fund_provider,
    key,
    start_net,
    validator,
    wait_until,
    worker,
)

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

BATCHED = {**RULES, "batch": {"files": 2, "max_delay_s": 30.0}}


@pytest.fixture
def net(tmp_path):
    n = start_net(tmp_path, orch={"rules": BATCHED})
    yield n
    n.close()


def _events(net: Net, name: str, node: str) -> list:
    return [e for e in net.fed.events(net.fed.deployment.block).poll()
            if e.name == name and e.args["node"].lower() == node.lower()]


def _orch(net: Net, path: str, response: type) -> object:
    async def read() -> object:
        async with SignedClient(net.orch.url, "0x" + bytes(key("mgr").key).hex()) as c:
            return await c.call("GET", path, response=response)
    return asyncio.run(read())


def test_batches_judged_per_file_the_forged_leaf_slashed_the_honest_batch_paid(net: Net):
    (hp, hn, _), (fp, fn, _) = fund_provider(net, "h0"), fund_provider(net, "f0")
    v = validator(net)
    v.start()
    h, f = worker(net, "h0", max_files=2), worker(net, "f0", {"mode": "forge-rewards"},
                                                    max_files=2)
    h.start()
    f.start()
    assert h.wait(300) == 0, h.log.read_text()[-3000:]
    assert f.wait(300) == 0, f.log.read_text()[-3000:]
    # one submission per worker, of both its files; no file submitted on its own
    [hb], [fb] = _events(net, "BatchSubmitted", hn.address), _events(net, "BatchSubmitted",
                                                                    fn.address)
    assert hb.args["count"] == fb.args["count"] == 2
    assert not _events(net, "WorkSubmitted", hn.address) + _events(net, "WorkSubmitted",
                                                                   fn.address)
    # the forged file is opened out of its batch and hard-invalidated: slashed, ejected
    wait_until(lambda: any(net.fed.work(bytes(e.args["work_id"])).status ==
                           WorkStatus.HARD_INVALIDATED
                           for e in _events(net, "LeafOpened", fn.address)), 300)
    stake = max(PARAMS.min_stake, PARAMS.stake_per_unit)
    # both its files are forged: each opened leaf is a verdict of its own, as two files are
    wait_until(lambda: len(_events(net, "LeafOpened", fn.address)) == 2, 120)
    hard = [e for e in _events(net, "LeafOpened", fn.address)
            if net.fed.work(bytes(e.args["work_id"])).status == WorkStatus.HARD_INVALIDATED]
    assert net.fed.provider(fp.address).stake == max(0, stake - len(hard) * PARAMS.slash_penalty)
    assert net.fed.provider(hp.address).stake == stake and net.fed.node(fn.address).pool == 0
    assert net.fed.standing(bytes(fb.args["batch_id"])) == Standing.WIPED  # its neighbours too
    # the honest files are accepted in the ledger by their own work ids, none opened on chain
    hid = bytes(hb.args["batch_id"]).hex()

    def accepted() -> bool:
        rows = [r for r in _rows(net) if r.node.lower() == hn.address.lower()]
        return len(rows) == 2 and all(r.status.value == "accepted" and r.batch_id == hid
                                      for r in rows)
    wait_until(accepted, 300)
    assert not _events(net, "LeafOpened", hn.address)
    info = _orch(net, f"/batches/{hid}", BatchInfo)
    assert info.submitted and len(info.leaves) == 2 and info.root == bytes(
        hb.args["root"]).hex()
    with pytest.raises(NoSuchBatch):
        _orch(net, "/batches/" + "ab" * 32, BatchInfo)
    # the books follow BatchSubmitted / LeafOpened / verdicts as the chain reads them
    hist = pool_history(net.fed, net.pool)

    def books_agree() -> bool:
        nodes = {n.address.lower(): n for n in _orch(net, "/nodes", PoolNodes).nodes}
        return all(nodes[a].rewards_earned == r["earned"] and nodes[a].rewards_claimable ==
                   r["claimable"] for a, r in hist["rewards"].items())
    wait_until(books_agree, 30)
    assert hist["rewards"][hn.address.lower()]["earned"] == hb.args["reward"]
    assert hist["rewards"][fn.address.lower()]["earned"] == 0
    # after the lock the honest batch is claimed as one item, whatever its size
    net.fed.backend.advance_time(PARAMS.lock_period + 1)
    mine = provider_rewards(net.fed, net.pool, hp.address)
    assert [w["batch"] for w in mine["works"]] == [True] and mine["works"][0]["claimable"]
    got = Claimer(net.fed.as_(hp), net.pool, 1.0).claim_once()
    assert got.items == 1 and got.amount == hb.args["reward"]
    assert net.fed.work(bytes(hb.args["batch_id"])).status == WorkStatus.CLAIMED


def _copies(net: Net, node: str) -> list:
    return [e for e in _events(net, "LeafOpened", node) if e.args["copy"]]


def _claimable(net: Net, provider: str) -> int:
    return sum(w["reward"] for w in provider_rewards(net.fed, net.pool, provider)["works"]
               if w["claimable"])


def test_a_file_in_a_batch_and_on_its_own_is_paid_once_either_order(net: Net):
    """Double pay: a node's file in one of its batches and also submitted on its own. The chain
    cannot see it (the leaves are off chain); the validator opens the leaf as the copy it is,
    whichever came first: the file submitted on its own after the batch was judged (here by
    its provider, `submit_work`), or before the batch's root (`double-submit` file-first).
    The copy's batch is accused hard; the honest node's batch is paid."""
    (hp, hn, _), (dp, dn, _), (fp, fn, _) = (fund_provider(net, x) for x in ("h0", "d0", "f1"))
    v = validator(net)
    v.start()
    ws = [worker(net, "h0", max_files=2), worker(net, "d0", max_files=2),
          worker(net, "f1", {"mode": "double-submit", "double_order": "file-first"},
                 max_files=2)]
    for w in ws:
        w.start()
    for w in ws:
        assert w.wait(300) == 0, w.log.read_text()[-3000:]
    [hb], [db], [fb] = (_events(net, "BatchSubmitted", n.address) for n in (hn, dn, fn))
    # batch first: once its leaves are judged (accepted, nothing on chain), the provider
    # submits the batch's first file again on its own
    did = bytes(db.args["batch_id"]).hex()
    wait_until(lambda: sum(r.status.value == "accepted" for r in _rows(net)
                           if r.batch_id == did) == 2, 300)
    first = _orch(net, f"/batches/{did}", BatchInfo).leaves[0]
    stake = max(PARAMS.min_stake, PARAMS.stake_per_unit)
    once = net.fed.as_(dp).submit_work(net.pool, dn.address, bytes.fromhex(first.sha256),
                                       first.work_units).event("WorkSubmitted").args
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: _copies(net, dn.address) and _copies(net, fn.address), 60)
    # the file is paid at most once: whatever the two providers can claim after the lock is
    # no more than their batches (the node's files, each once)
    wait_until(lambda: _accepted_batch(net, hb), 300)
    net.fed.backend.advance_time(PARAMS.lock_period + 1)
    got = {"d0": _claimable(net, dp.address), "f1": _claimable(net, fp.address),
           "h0": _claimable(net, hp.address)}
    assert got["d0"] <= db.args["reward"], (got, "d0 paid twice", once["reward"])
    assert got["f1"] <= fb.args["reward"], (got, "f1 paid twice")
    # each copy voided in its batch, the batch accused hard: the provider slashed
    for node, prov, b in ((dn, dp, db), (fn, fp, fb)):
        [c] = _copies(net, node.address)
        assert c.args["batch_id"] == b.args["batch_id"]
        assert net.fed.work(bytes(b.args["batch_id"])).status == WorkStatus.HARD_INVALIDATED
        assert net.fed.provider(prov.address).stake == stake - PARAMS.slash_penalty
    assert bytes(_copies(net, dn.address)[0].args["work_id"]) == bytes(once["work_id"])
    # the honest neighbour's batch is untouched and paid in full
    assert got["h0"] == hb.args["reward"]
    assert net.fed.provider(hp.address).stake == stake
    assert not _events(net, "LeafOpened", hn.address)


def _accepted_batch(net: Net, b) -> bool:
    bid = bytes(b.args["batch_id"]).hex()
    return sum(r.status.value == "accepted" for r in _rows(net) if r.batch_id == bid) == 2


def test_a_leaf_submitted_again_after_its_batch_window_closed_is_the_copy(net: Net):
    """The same double pay, later: the file submitted on its own once its batch's window has
    closed, when the chain refuses `open_leaf`. The validator still remembers the leaf
    (`LeafMemory`, past the window) and hard-invalidates the later submission, whose own
    window is open: the file is paid once (in its batch), the provider slashed for the copy."""
    dp, dn, _ = fund_provider(net, "d0")
    v = validator(net)
    v.start()
    w = worker(net, "d0", max_files=2)
    w.start()
    assert w.wait(300) == 0, w.log.read_text()[-3000:]
    [db] = _events(net, "BatchSubmitted", dn.address)
    wait_until(lambda: _accepted_batch(net, db), 300)
    stake = max(PARAMS.min_stake, PARAMS.stake_per_unit)
    net.fed.backend.advance_time(PARAMS.invalidation_window + 1)  # the batch's window closes
    first = _orch(net, f"/batches/{bytes(db.args['batch_id']).hex()}", BatchInfo).leaves[0]
    once = net.fed.as_(dp).submit_work(net.pool, dn.address, bytes.fromhex(first.sha256),
                                       first.work_units).event("WorkSubmitted").args
    copy = bytes(once["work_id"])
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: net.fed.work(copy).status == WorkStatus.HARD_INVALIDATED, 60)
    net.fed.backend.advance_time(PARAMS.lock_period + 1)
    got = _claimable(net, dp.address)
    assert got == db.args["reward"], (got, "paid twice", once["reward"])
    assert net.fed.work(copy).status == WorkStatus.HARD_INVALIDATED
    assert net.fed.provider(dp.address).stake == stake - PARAMS.slash_penalty
    # the batch itself stands (its window closed before the verdict) and is claimed whole
    assert net.fed.standing(bytes(db.args["batch_id"])) == Standing.CLEAR
    assert not _events(net, "LeafOpened", dn.address)


def test_a_co_validator_that_never_expanded_the_batch_upholds_the_duplicate_verdict(tmp_path):
    """The duplicate verdict is disputable: another validator votes on it. One that never
    expanded the earlier batch (another share) has no memory of the leaf; it reads the ledger's
    batch of that work id and the batch's leaves, checks them against the chain (the batch id
    of that node and root, submitted before the file) and upholds. Judging the file as a file
    it voted to overturn (the file itself is honest) and the duplicate was paid after all."""
    params = PARAMS.model_copy(update={"dispute_period": 60, "vote_period": 30, "quorum": 1})
    net = start_net(tmp_path, orch={"rules": BATCHED}, params=params)
    try:
        dp, dn, _ = fund_provider(net, "d0")
        w = worker(net, "d0", max_files=2)
        w.start()
        assert w.wait(300) == 0, w.log.read_text()[-3000:]
        [db] = _events(net, "BatchSubmitted", dn.address)
        bid = bytes(db.args["batch_id"])
        # the voter's share leaves the batch to the other validator: it never reads its leaves
        other = 1 - int.from_bytes(bid, "big") % 2
        v = validator(net, share={"index": other, "of": 2})
        v.start()
        net.fed.backend.advance_time(PARAMS.invalidation_window + 1)
        first = _orch(net, f"/batches/{bid.hex()}", BatchInfo).leaves[0]
        copy = bytes(net.fed.as_(dp).submit_work(net.pool, dn.address,
                                                 bytes.fromhex(first.sha256),
                                                 first.work_units).event("WorkSubmitted")
                     .args["work_id"])
        # the validator of the batch's share accuses the copy (here: a key of its own)
        judge = key("val2")
        net.fed.backend.fund(judge.address, 10**21)
        net.fed.set_validator(judge.address)
        net.fed.as_(judge).hard_invalidate(copy)
        voter = key("val").address.lower()

        def voted() -> list:
            return [e.args["uphold"] for e in net.fed.events(net.fed.deployment.block).poll()
                    if e.name == "VerdictVoted" and bytes(e.args["work_id"]) == copy
                    and e.args["validator"].lower() == voter]
        assert wait_until(voted, 120) == [True]
        assert not _events(net, "LeafOpened", dn.address)  # its leaves never read by it
        net.fed.backend.advance_time(params.dispute_period + 1)
        net.fed.settle(copy)
        assert net.fed.work(copy).status == WorkStatus.HARD_INVALIDATED
    finally:
        net.close()
