"""Validators answerable for their verdicts (issue 25): a verdict locks part of its validator's
bond and is final only after a dispute period; the accused provider may challenge it and other
validators re-judge it; an overturned verdict pays the locked bond to the provider, a verdict
upheld slashes the cheater as before. Numbers are asserted: stakes, bonds, rewards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshrl.protocol import Backend, EthTesterBackend, Protocol, Standing, TxReverted, WorkStatus

from .helpers import BOND, PARAMS, RATE, TOKEN, World, build_world, file_hash, key

DISPUTE, VOTE = 3600, 1800
PARAMS_D = PARAMS.model_copy(update={"dispute_period": DISPUTE, "vote_period": VOTE,
                                     "quorum": 1})
VB = PARAMS_D.verdict_bond
LOCK = PARAMS_D.lock_period


@dataclass
class Court:
    w: World
    rogue: Protocol  # world.validator: makes the verdicts below
    judge: Protocol  # a second bonded validator, who re-judges

    def submit(self, provider: Protocol, node: str, label: str, units: int) -> bytes:
        provider.submit_work(self.w.pool, node, file_hash(label), units)
        return provider.work_id(node, file_hash(label))


def _court(backend: Backend) -> Court:
    w = build_world(backend, PARAMS_D)
    val2 = key("val2")
    backend.fund(val2.address, 10**21)
    w.fed.mint(val2.address, 10_000 * TOKEN)
    w.fed.set_validator(val2.address)
    judge = w.fed.as_(val2)
    judge.post_bond(BOND)
    w.p2.join_pool(*w.invite(w.pool, w.n3.address, nonce=9))  # the cheater's node
    return Court(w, w.validator, judge)


ANVIL = pytest.param("anvil", marks=pytest.mark.anvil)


@pytest.fixture(scope="module", params=["eth-tester", ANVIL])
def base_court(request: pytest.FixtureRequest) -> Court:
    if request.param == "anvil":
        return _court(request.getfixturevalue("anvil_backend"))
    return _court(EthTesterBackend())


@pytest.fixture(scope="module")
def tester_court() -> Court:
    return _court(EthTesterBackend())


def _fresh(c: Court) -> Iterator[Court]:
    snap = c.w.backend.snapshot()
    yield c
    c.w.backend.revert(snap)


@pytest.fixture
def court(base_court: Court) -> Iterator[Court]:
    yield from _fresh(base_court)


@pytest.fixture
def tc(tester_court: Court) -> Iterator[Court]:
    yield from _fresh(tester_court)


def test_rogue_verdict_on_honest_work_is_overturned_and_pays_the_provider(court: Court) -> None:
    w, fed, p1, n1 = court.w, court.w.fed, court.w.p1, court.w.n1.address
    honest = court.submit(p1, n1, "honest", 5)
    other = court.submit(p1, n1, "honest-too", 3)
    balance, stake = fed.balance(p1.address), fed.provider(p1.address).stake
    r = court.rogue.hard_invalidate(honest)
    assert [e.name for e in r.events if e.name in ("Slashed", "WorkInvalidated")] == []
    assert r.event("WorkAccused").args["index"] == 1 and fed.node(n1).pool == 0
    assert fed.work(honest).status == WorkStatus.ACCUSED
    assert court.rogue.bond() == (BOND, VB)
    assert fed.standing(other) == Standing.DISPUTED  # the open verdict reaches it
    p1.challenge(honest)
    court.judge.vote(honest, uphold=False)
    w.expect_revert("work: dispute open", lambda: fed.settle(honest))
    w.backend.advance_time(DISPUTE)
    r = w.stranger.settle(honest)  # anyone settles
    assert r.event("VerdictOverturned").args["forfeited"] == VB
    assert fed.provider(p1.address).stake == stake + VB  # the rogue's bond, paid to the wronged
    assert court.rogue.bond() == (BOND - VB, 0)
    assert fed.work(honest).status == WorkStatus.SUBMITTED
    assert fed.standing(other) == Standing.CLEAR
    w.backend.advance_time(LOCK)
    assert p1.claim([honest, other]).event("RewardsClaimed").args["amount"] == 8 * RATE
    assert fed.balance(p1.address) == balance + 8 * RATE
    p1.join_pool(*w.invite(w.pool, n1, nonce=30))  # the pool may take it back at once


def test_real_cheater_is_still_slashed_when_it_challenges(court: Court) -> None:
    w, fed, p2, n3 = court.w, court.w.fed, court.w.p2, court.w.n3.address
    fraud = court.submit(p2, n3, "fraud", 10)
    unchecked = court.submit(p2, n3, "unchecked", 4)
    court.rogue.hard_invalidate(fraud)  # this time the verdict is right
    p2.challenge(fraud)
    court.judge.vote(fraud, uphold=True)
    w.backend.advance_time(DISPUTE)
    r = fed.settle(fraud)
    assert r.event("Slashed").args["amount"] == PARAMS.slash_penalty
    assert r.event("RewardsWiped").args["node"] == n3
    # the challenge cost the cheater its deposit (half the verdict bond), paid to the accuser
    assert fed.provider(p2.address).stake == 200 * TOKEN - PARAMS.slash_penalty - VB // 2
    assert court.rogue.bond() == (BOND + VB // 2, 0)
    assert court.judge.bond() == (BOND, 0)  # its vote's stake is back
    assert fed.work(fraud).status == WorkStatus.HARD_INVALIDATED
    w.backend.advance_time(LOCK)
    w.expect_revert("work: invalidated", lambda: p2.claim([fraud]))
    w.expect_revert("work: rewards wiped", lambda: p2.claim([unchecked]), check_funds=True)


def test_unchallenged_verdict_stands_after_the_dispute_period(tc: Court) -> None:
    w, fed = tc.w, tc.w.fed
    fraud = tc.submit(w.p2, w.n3.address, "fraud", 1)
    tc.rogue.hard_invalidate(fraud)
    tc.judge.vote(fraud, uphold=True)  # a co-validator confirms it
    w.backend.advance_time(DISPUTE - 60)
    w.expect_revert("work: dispute open", lambda: fed.settle(fraud))
    w.backend.advance_time(120)
    w.expect_revert("work: dispute period over", lambda: w.p2.challenge(fraud))
    assert fed.settle(fraud).event("Slashed").args["amount"] == PARAMS.slash_penalty
    w.expect_revert("work: not accused", lambda: fed.settle(fraud))


def test_a_challenge_nobody_upholds_overturns_the_verdict(tc: Court) -> None:
    w, fed, p1 = tc.w, tc.w.fed, tc.w.p1
    item = tc.submit(p1, w.n1.address, "honest", 2)
    tc.rogue.soft_invalidate(item)  # soft verdicts are answerable too
    w.backend.advance_time(DISPUTE - 10)
    r = p1.challenge(item)  # at the last moment: the vote still gets its time
    assert r.event("VerdictChallenged").args["until"] == w.backend.now() + VOTE
    w.backend.advance_time(DISPUTE)
    assert fed.settle(item).event("VerdictOverturned").args["provider"] == p1.address
    assert fed.provider(p1.address).stake == 300 * TOKEN + VB
    w.backend.advance_time(LOCK)
    assert p1.claim([item]).event("RewardsClaimed").args["amount"] == 2 * RATE


def test_disputed_rewards_and_stake_wait_for_the_settlement(tc: Court) -> None:
    w, fed, p2, n3 = tc.w, tc.w.fed, tc.w.p2, tc.w.n3.address
    fraud = tc.submit(p2, n3, "fraud", 1)
    unchecked = tc.submit(p2, n3, "unchecked", 1)
    p2.request_unstake(100 * TOKEN)
    tc.rogue.hard_invalidate(fraud)
    w.backend.advance_time(PARAMS.unbonding_delay)  # past the lock and the unbonding delay
    w.expect_revert("work: under review", lambda: p2.claim([fraud]))
    w.expect_revert("work: under review", lambda: p2.claim([unchecked]))
    w.expect_revert("stake: verdict pending", p2.withdraw, check_funds=True)
    assert not fed.claimable(unchecked)
    review = fed.settle(fraud).event("ReviewOpened").args["until"]
    # upheld: the caught provider's work is reviewed for one more period before anything leaves
    w.expect_revert("stake: work still judgeable", p2.withdraw, check_funds=True)
    assert fed.review_until(p2.address) == review > w.backend.now()
    w.backend.advance_time(DISPUTE)
    assert p2.withdraw().event("Withdrawn").args["amount"] == 100 * TOKEN
    assert fed.provider(p2.address).stake == 100 * TOKEN - PARAMS.slash_penalty


def test_verdicts_need_a_free_bond_and_votes_a_bond(tc: Court) -> None:
    w, fed, s = tc.w, tc.w.fed, tc.w.stranger
    items = [tc.submit(w.p1, w.n1.address, f"i{i}", 1) for i in range(BOND // VB + 1)]
    fed.set_validator(s.address)
    w.expect_revert("stake: bond too low", lambda: s.soft_invalidate(items[0]))
    for wid in items[:-1]:
        tc.rogue.soft_invalidate(wid)
    assert tc.rogue.bond() == (BOND, BOND)
    w.expect_revert("stake: bond too low", lambda: tc.rogue.soft_invalidate(items[-1]))
    w.expect_revert("stake: bond locked", lambda: tc.rogue.withdraw_bond(1))
    w.expect_revert("stake: bond too low", lambda: s.vote(items[0], True))
    w.expect_revert("work: own verdict", lambda: tc.rogue.vote(items[0], True))
    w.expect_revert("work: not your work", lambda: w.p2.challenge(items[0]))
    fed.set_validator(w.p1.address)  # a provider that is a validator too
    w.p1.post_bond(BOND)
    w.expect_revert("work: own work", lambda: w.p1.vote(items[0], False))
    tc.judge.vote(items[0], True)
    assert tc.judge.bond() == (BOND, VB // 2)  # a vote locks half a verdict bond
    w.expect_revert("work: already voted", lambda: tc.judge.vote(items[0], False))
    w.backend.advance_time(DISPUTE + 60)
    fed.settle(items[0])  # confirmed: it stands at the end of its period
    w.backend.advance_time(24 * DISPUTE)  # unconfirmed verdicts stay open 24 periods
    w.expect_revert("work: dispute period over", lambda: tc.judge.vote(items[1], True))
    assert tc.rogue.bond() == (BOND, BOND - VB)
    assert tc.judge.bond() == (BOND, 0)
    before = fed.balance(tc.rogue.address)
    tc.rogue.withdraw_bond(VB)
    assert fed.balance(tc.rogue.address) == before + VB
    assert fed.totals()["bonds"] == 3 * BOND - VB


def test_quorum_of_two_needs_two_upholds(tc: Court) -> None:
    w, fed = tc.w, tc.w.fed
    fed.set_dispute_params(VB, DISPUTE, VOTE, 2)
    fraud = tc.submit(w.p2, w.n3.address, "fraud", 1)
    tc.rogue.hard_invalidate(fraud)
    w.p2.challenge(fraud)
    tc.judge.vote(fraud, True)  # one of two
    w.backend.advance_time(DISPUTE)
    assert fed.settle(fraud).event("VerdictOverturned").args["forfeited"] == VB
    w.expect_revert("work: zero quorum", lambda: fed.set_dispute_params(VB, DISPUTE, VOTE, 0))
    w.expect_revert("work: zero vote period", lambda: fed.set_dispute_params(VB, DISPUTE, 0, 1))


DISPUTE_ACTION = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 1)),
    st.tuples(st.just("accuse"), st.booleans(), st.integers(0, 5)),
    st.tuples(st.just("challenge"), st.integers(0, 5)),
    st.tuples(st.just("vote"), st.booleans(), st.integers(0, 5)),
    st.tuples(st.just("settle"), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([60, DISPUTE, LOCK])),
    st.tuples(st.just("claim"), st.integers(0, 5)),
    st.tuples(st.just("unstake_withdraw"), st.integers(0, 1)),
    st.tuples(st.just("withdraw_bond"),),
)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(DISPUTE_ACTION, min_size=1, max_size=12))
def test_books_balance_through_any_disputes(tester_court: Court, actions: list) -> None:
    c = tester_court
    w, fed = c.w, c.w.fed
    snap = w.backend.snapshot()
    try:
        owners = [(w.p1, w.n1.address), (w.p2, w.n3.address)]
        items: list[tuple[Protocol, bytes]] = []
        supply0 = fed.token.functions.totalSupply().call()

        def pick(k: int) -> tuple[Protocol, bytes] | None:
            return items[k % len(items)] if items else None

        for i, a in enumerate(actions):
            with contextlib.suppress(TxReverted):
                if a[0] == "submit":
                    p, node = owners[a[1]]
                    items.append((p, c.submit(p, node, f"prop-{i}", 3)))
                elif a[0] == "accuse" and pick(a[2]):
                    wid = pick(a[2])[1]
                    (c.rogue.hard_invalidate if a[1] else c.rogue.soft_invalidate)(wid)
                elif a[0] == "challenge" and pick(a[1]):
                    p, wid = pick(a[1])
                    p.challenge(wid)
                elif a[0] == "vote" and pick(a[2]):
                    c.judge.vote(pick(a[2])[1], a[1])
                elif a[0] == "settle" and pick(a[1]):
                    fed.settle(pick(a[1])[1])
                elif a[0] == "advance":
                    w.backend.advance_time(a[1])
                elif a[0] == "claim" and pick(a[1]):
                    p, wid = pick(a[1])
                    p.claim([wid])
                elif a[0] == "unstake_withdraw":
                    p = owners[a[1]][0]
                    p.request_unstake(TOKEN)
                    p.withdraw()
                elif a[0] == "withdraw_bond":
                    c.rogue.withdraw_bond(c.rogue.bond()[0] - c.rogue.bond()[1])
        totals = fed.totals()
        provs = [fed.provider(p.address) for p, _ in owners]
        bonds = [c.rogue.bond(), c.judge.bond()]
        assert totals["stake"] == sum(p.stake for p in provs)
        assert totals["unbonding"] == sum(p.unbonding for p in provs)
        assert totals["bonds"] == sum(b for b, _ in bonds)
        assert all(locked <= b for b, locked in bonds)
        held = fed.balance(fed.contract.address)
        assert held == (totals["stake"] + totals["unbonding"] + totals["slashed"]
                        + totals["bonds"] + totals["deposits"])
        deposits = sum(fed.dispute(wid).deposit for _, wid in items
                       if fed.work(wid).status == WorkStatus.ACCUSED)
        assert totals["deposits"] == deposits
        supply = fed.token.functions.totalSupply().call()
        assert supply == supply0 + totals["claimed"]
        accused = [wid for _, wid in items if fed.work(wid).status == WorkStatus.ACCUSED]
        open_hard = sum(fed.dispute(wid).hard for wid in accused)
        assert sum(fed.contract.functions.open_verdicts(p.address).call()
                   for p, _ in owners) == open_hard
        assert c.rogue.bond()[1] == VB * len(accused)
    finally:
        w.backend.revert(snap)
