"""The validator's side of disputes (`meshrl.validator.disputes`), on an in-process chain: it
posts its bond, accuses, votes on another validator's verdict by its own judgment of the file,
and settles; the rule of which step to take is a table."""

from __future__ import annotations

import pytest

from meshrl.protocol import EthTesterBackend, WorkStatus
from meshrl.validator.disputes import Action, Clerk, next_action
from meshrl.wire.models import Verdict, VerdictKind
from protocol.helpers import BOND, PARAMS, TOKEN
from protocol.test_disputes import DISPUTE, VB, Court, _court
from rpc_requests import sent_requests

A, S, H = VerdictKind.ACCEPT, VerdictKind.SOFT_INVALID, VerdictKind.HARD_INVALID


@pytest.mark.parametrize(("status", "mine", "kind", "action"), [
    (WorkStatus.SUBMITTED, False, H, Action.ACCUSE_HARD),
    (WorkStatus.SUBMITTED, False, S, Action.ACCUSE_SOFT),
    (WorkStatus.SUBMITTED, False, A, Action.NONE),
    (WorkStatus.ACCUSED, False, H, Action.UPHOLD),
    (WorkStatus.ACCUSED, False, S, Action.UPHOLD),
    (WorkStatus.ACCUSED, False, A, Action.OVERTURN),
    (WorkStatus.ACCUSED, True, A, Action.NONE),  # its own verdict: it does not vote
    (WorkStatus.HARD_INVALIDATED, False, A, Action.NONE),
    (WorkStatus.CLAIMED, False, H, Action.NONE),
])
def test_next_action(status: int, mine: bool, kind: VerdictKind, action: Action) -> None:
    assert next_action(status, mine, kind) is action


@pytest.fixture(scope="module")
def court() -> Court:
    return _court(EthTesterBackend())


def test_honest_clerk_overturns_a_rogue_and_upholds_a_true_verdict(court: Court) -> None:
    w, fed = court.w, court.w.fed
    snap = w.backend.snapshot()
    try:
        rogue, honest = Clerk(court.rogue), Clerk(court.judge)
        assert honest.ensure_bond(3) == 0  # its 1000-token bond covers 3 verdicts
        assert honest.ensure_bond(12) == 12 * VB - BOND and court.judge.bond()[0] == 12 * VB
        good = court.submit(w.p1, w.n1.address, "honest", 5)
        bad = court.submit(w.p2, w.n3.address, "fraud", 5)
        assert rogue.act(good, H) and rogue.act(bad, H)  # one verdict wrong, one right
        assert honest.act(good, A) and honest.act(bad, H)  # overturn, uphold
        assert rogue.act(good, H) == ""  # its own open verdict: nothing to do
        stake1, stake2 = fed.provider(w.p1.address).stake, fed.provider(w.p2.address).stake
        assert honest.settle_due() == 0  # not yet due
        w.backend.advance_time(DISPUTE)
        assert honest.settle_due() == 2 and rogue.settle_due() == 0  # settled already
        assert honest.to_settle == {}
        # the accuser followed its verdicts to the end an unconfirmed one may stay open (24
        # periods); a vote confirmed or challenged them sooner: it finds them settled then
        w.backend.advance_time(24 * DISPUTE)
        assert rogue.settle_due() == 0 and rogue.to_settle == {}
        assert fed.work(good).status == WorkStatus.SUBMITTED
        assert fed.work(bad).status == WorkStatus.HARD_INVALIDATED
        assert fed.provider(w.p1.address).stake == stake1 + VB
        assert fed.provider(w.p2.address).stake == stake2 - PARAMS.slash_penalty
        assert court.rogue.bond() == (BOND - VB, 0)
        assert fed.balance(court.judge.address) == 10_000 * TOKEN - 12 * VB
    finally:
        w.backend.revert(snap)


def test_settling_with_nothing_followed_reads_nothing(court: Court) -> None:
    """`settle_due` runs every loop of the validator: with no verdict followed it sends no
    request (it read the latest block each time); with one followed it reads the chain's time."""
    w = court.w
    snap = w.backend.snapshot()
    try:
        clerk = Clerk(court.judge)
        with sent_requests(w.backend.w3) as sent:
            assert clerk.settle_due() == 0
        assert sent == []
        bad = court.submit(w.p2, w.n3.address, "fraud", 5)
        assert clerk.act(bad, H) and bad in clerk.to_settle
        with sent_requests(w.backend.w3) as sent:
            assert clerk.settle_due() == 0  # not yet due
        assert sent == ["eth_getBlockByNumber"]
    finally:
        w.backend.revert(snap)


def test_an_accepted_unaccused_file_asks_the_chain_nothing_and_an_accusation_is_still_voted(
        court: Court, tmp_path) -> None:
    """The validator's loop on an in-process chain: accepting a file it queued from its
    submission event, seen accused by no one, sends no request (a view call per accepted file
    before); a file accused before its verdict, or after it, still gets the overturn vote."""
    import asyncio

    from meshrl.pool import Decision, PoolRules
    from meshrl.validator.config import ValidatorConfig
    from meshrl.validator.node import ValidatorNode
    from meshrl.validator.state import LeafMemory, ValidatorState

    w = court.w
    snap = w.backend.snapshot()
    try:
        node = ValidatorNode(ValidatorConfig(pool_id=w.pool), w.fed.account)  # key: unused here
        node.chain, node.clerk = court.judge, Clerk(court.judge)
        node.clerk.ensure_bond(3)
        start = w.backend.block_number() + 1
        node.cursor, node.state = court.judge.events(start), ValidatorState.load(
            tmp_path / "state.json", start)
        node.memory = LeafMemory(str(tmp_path / "leaf_memory.jsonl"), 100)
        node.rules = PoolRules(pool_id=w.pool)  # files submitted one by one
        posted: list[Verdict] = []

        async def post(v: Verdict) -> bool:  # the orchestrator is not under test here
            posted.append(v)
            return True
        node._post = post  # type: ignore[method-assign]
        rogue, ok = Clerk(court.rogue), Decision(A, "all checks passed")

        def job(wid: bytes):  # the queued job of `wid`
            return next(j for j in node.state.queue if j.work_id == wid.hex())

        async def go() -> tuple[bytes, bytes]:
            quiet = court.submit(w.p1, w.n1.address, "quiet", 5)
            early = court.submit(w.p1, w.n1.address, "accused-first", 5)
            late = court.submit(w.p1, w.n1.address, "accused-later", 5)
            await node._poll()
            assert node.unaccused == {quiet.hex(), early.hex(), late.hex()}
            with sent_requests(w.backend.w3) as sent:
                await node._act(job(quiet), ok)
            assert sent == []  # nothing on chain to do, and nothing asked
            assert rogue.act(early, H)  # accused before this validator's verdict
            await node._poll()
            assert early.hex() not in node.unaccused
            with sent_requests(w.backend.w3) as sent:
                await node._act(job(early), ok)
            assert "eth_sendRawTransaction" in sent  # the overturn vote
            await node._act(job(late), ok)  # accepted unasked ...
            assert rogue.act(late, H)  # ... then accused: the vote comes with the event
            await node._poll()
            return early, late
        early_late = asyncio.run(go())
        fed = w.fed
        assert [fed.dispute(x).overturn for x in early_late] == [1, 1]
        assert len(posted) == 3 and {v.verdict for v in posted} == {VerdictKind.ACCEPT}
        w.backend.advance_time(DISPUTE)
        assert node.clerk.settle_due() == 2  # both overturned: the files stand
        assert all(fed.work(x).status == WorkStatus.SUBMITTED for x in early_late)
    finally:
        w.backend.revert(snap)

