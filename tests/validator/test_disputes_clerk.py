"""The validator's side of disputes (`meshrl.validator.disputes`), on an in-process chain: it
posts its bond, accuses, votes on another validator's verdict by its own judgment of the file,
and settles; the rule of which step to take is a table."""

from __future__ import annotations

import pytest

from meshrl.protocol import EthTesterBackend, WorkStatus
from meshrl.validator.disputes import Action, Clerk, next_action
from meshrl.wire.models import VerdictKind
from protocol.helpers import BOND, PARAMS, TOKEN
from protocol.test_disputes import DISPUTE, VB, Court, _court

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
        assert rogue.to_settle == {} and honest.to_settle == {}
        assert fed.work(good).status == WorkStatus.SUBMITTED
        assert fed.work(bad).status == WorkStatus.HARD_INVALIDATED
        assert fed.provider(w.p1.address).stake == stake1 + VB
        assert fed.provider(w.p2.address).stake == stake2 - PARAMS.slash_penalty
        assert court.rogue.bond() == (BOND - VB, 0)
        assert fed.balance(court.judge.address) == 10_000 * TOKEN - 12 * VB
    finally:
        w.backend.revert(snap)
