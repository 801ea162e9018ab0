"""The verdict game (issue 42, docs/protocol.md "The verdict game"): each way the dispute
machinery of issue 25 could be gamed, played against the contracts, on eth-tester and anvil.
Each test measures in tokens what the deviator paid and gained; each failed on the contracts
before the fix (the move succeeded, or paid off)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from meshrl.network.checks import dispute_counts
from meshrl.orchestrator.books import Books
from meshrl.protocol import EthTesterBackend, Standing, WorkStatus
from meshrl.protocol.history import pool_disputes, pool_history

from .helpers import BOND, PARAMS, RATE, TOKEN, key
from .test_disputes import ANVIL, DISPUTE, LOCK, VB, VOTE, Court, _court, _fresh

PENALTY = PARAMS.slash_penalty
STAKE = VB // 2  # a vote's stake, a challenge's deposit
UNCONFIRMED = 24 * DISPUTE  # how long a verdict no co-validator confirmed stays open


@pytest.fixture(scope="module", params=["eth-tester", ANVIL])
def game_court(request: pytest.FixtureRequest) -> Court:
    if request.param == "anvil":
        return _court(request.getfixturevalue("anvil_backend"))
    return _court(EthTesterBackend())


@pytest.fixture
def c(game_court: Court) -> Iterator[Court]:
    yield from _fresh(game_court)


def _books_match(c: Court) -> dict[str, dict[str, int]]:
    """The orchestrator's books, fed every event from the deployment, say of each node of the
    pool what the chain says (`pool_history`): rewards earned and claimable now."""
    w, fed = c.w, c.w.fed
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE nodes (address TEXT, provider TEXT)")
    books = Books(db, w.pool)
    books.set_lock_period(PARAMS.lock_period, PARAMS.invalidation_window)
    owners = {w.n1.address: w.p1.address, w.n2.address: w.p2.address,
              w.n3.address: w.p2.address}
    provider_of = {n.lower(): p.lower() for n, p in owners.items()}
    for node, provider in provider_of.items():
        db.execute("INSERT INTO nodes VALUES (?, ?)", (node, provider))
        books.joined(node, provider)
    for ev in fed.events().poll():
        ts = w.backend.w3.eth.get_block(ev.block)["timestamp"] if books.needs_time(ev) else None
        books.apply(ev, ts, provider_of)
    books.set_chain_time(w.backend.now())
    money = books.money()
    chain = pool_history(fed, w.pool)["rewards"]
    for node, r in chain.items():
        assert (money[node].earned, money[node].claimable) == (r["earned"], r["claimable"]), node
    return chain


def _stake(c: Court, p: object) -> int:
    return c.w.fed.provider(p.address).stake  # type: ignore[attr-defined]


def test_a_rogue_verdict_nobody_confirms_stays_open_and_costs_the_rogue(c: Court) -> None:
    """Passive co-validator, provider away for the first hour: the rogue's verdicts no longer
    stand after it; the provider comes back, challenges, and the rogue pays its bonds."""
    w, fed, p1, n1 = c.w, c.w.fed, c.w.p1, c.w.n1.address
    items = [c.submit(p1, n1, f"honest-{i}", 5) for i in range(3)]
    stake0 = _stake(c, p1)
    for wid in items[:2]:
        c.rogue.hard_invalidate(wid)
    w.backend.advance_time(DISPUTE + 60)
    for wid in items[:2]:  # no co-validator confirmed it: not final after the hour
        w.expect_revert("work: dispute open", lambda wid=wid: fed.settle(wid))
    w.backend.advance_time(3 * DISPUTE)  # the provider is back, hours later
    for wid in items[:2]:
        p1.challenge(wid)
    assert _stake(c, p1) == stake0 - 2 * STAKE
    w.backend.advance_time(VOTE)
    for wid in items[:2]:
        assert fed.settle(wid).event("VerdictOverturned").args["forfeited"] == VB
    # the rogue paid 2 bonds, gained nothing; the provider got them, its deposits back
    assert c.rogue.bond() == (BOND - 2 * VB, 0)
    assert _stake(c, p1) == stake0 + 2 * VB
    assert fed.totals()["slashed"] == 0
    assert [fed.standing(x) for x in items] == [Standing.CLEAR] * 3
    w.backend.advance_time(LOCK)
    assert _books_match(c)[n1.lower()]["claimable"] == 15 * RATE
    assert p1.claim(items).event("RewardsClaimed").args["amount"] == 15 * RATE


def test_the_federator_cannot_make_verdicts_final_at_once(c: Court) -> None:
    """`dispute_period = 0` made every verdict final at once and the bond never at risk;
    now it is refused, and a verdict made before a change keeps its own period."""
    w, fed, p1 = c.w, c.w.fed, c.w.p1
    w.expect_revert("work: dispute period below floor",
                    lambda: fed.set_dispute_params(VB, 0, VOTE, 1))
    w.expect_revert("work: dispute period below floor",
                    lambda: fed.set_dispute_params(VB, 59, VOTE, 1))
    item = c.submit(p1, w.n1.address, "honest", 5)
    stake0 = _stake(c, p1)
    c.rogue.hard_invalidate(item)
    fed.set_dispute_params(VB, 60, 30, 1)  # the shortest allowed, after the verdict
    w.backend.advance_time(DISPUTE)
    w.expect_revert("work: dispute open", lambda: fed.settle(item))  # its own period
    p1.challenge(item)
    w.backend.advance_time(VOTE + 1)
    fed.settle(item)
    assert c.rogue.bond() == (BOND - VB, 0)  # the rogue cannot withdraw its way out
    assert _stake(c, p1) == stake0 + VB and fed.totals()["slashed"] == 0


def test_a_single_rogue_voter_cannot_veto_true_verdicts(c: Court) -> None:
    """Two validators, quorum 1: the cheater challenges each caught fraud and the other
    validator votes to overturn. The vote now locks a stake, and the federator's ruling
    decides the tie: every fraud stands, the rogue voter and the cheater pay."""
    w, fed, p2, n3 = c.w, c.w.fed, c.w.p2, c.w.n3.address
    p2.add_stake(1000 * TOKEN)
    honest, rogue = c.judge, c.rogue  # here the judge accuses and the rogue votes
    frauds = [c.submit(p2, n3, f"fraud-{i}", 100) for i in range(3)]
    stake0 = _stake(c, p2)
    for wid in frauds:
        honest.hard_invalidate(wid)
        p2.challenge(wid)
        rogue.vote(wid, uphold=False)
        fed.rule(wid, uphold=True)
    assert rogue.bond() == (BOND, 3 * STAKE)  # its votes are at stake now
    w.backend.advance_time(DISPUTE + VOTE)
    for wid in frauds:
        assert fed.settle(wid).event("Slashed").args["amount"] == PENALTY
        assert fed.work(wid).status == WorkStatus.HARD_INVALIDATED
    assert rogue.bond() == (BOND - 3 * STAKE, 0)  # the rogue voter lost its stakes
    assert honest.bond() == (BOND + 3 * STAKE + 3 * STAKE, 0)  # deposits + the rogue's stakes
    assert _stake(c, p2) == stake0 - 3 * (PENALTY + STAKE)
    w.backend.advance_time(LOCK)
    assert not any(fed.claimable(wid) for wid in frauds)  # 300 units of reward, none paid
    assert _books_match(c)[n3.lower()]["earned"] == 0
    counts = dispute_counts(pool_disputes(fed, w.pool))  # what `meshrl network up` reports
    assert (counts["upheld"], counts["votes"], counts["stakes_moved"]) == (3, 3, 6 * STAKE)


def test_a_soft_accusation_no_longer_shields_a_fraud(c: Court) -> None:
    """A colluder's soft verdict made the honest hard one 'not pending'; a hard verdict now
    supersedes it: the cheater loses its node, reward and penalty, the colluder gains nothing."""
    w, fed, p2, n3 = c.w, c.w.fed, c.w.p2, c.w.n3.address
    fed.set_dispute_params(VB, 60, 30, 1)  # the shortest period: 24 of them end in the window
    fraud = c.submit(p2, n3, "fraud", 100)
    stake0 = _stake(c, p2)
    colluder, honest = c.rogue, c.judge
    soft = colluder.soft_invalidate(fraud).event("WorkAccused").args["until"]
    assert soft >= fed.work(fraud).judge_until  # a soft verdict outlives the window
    w.backend.advance_time(24 * 60 + 1)
    w.expect_revert("work: dispute open", lambda: fed.settle(fraud))
    assert fed.node(n3).pool == w.pool  # a soft verdict ejects nothing
    r = honest.hard_invalidate(fraud)
    assert r.event("WorkAccused").args["hard"] and fed.node(n3).pool == 0
    assert colluder.bond() == (BOND, 0) and fed.dispute(fraud).validator == honest.address
    w.backend.advance_time(UNCONFIRMED + 1)
    assert fed.settle(fraud).event("Slashed").args["amount"] == PENALTY
    assert fed.work(fraud).status == WorkStatus.HARD_INVALIDATED
    assert _stake(c, p2) == stake0 - PENALTY
    assert colluder.bond() == (BOND, 0) and honest.bond() == (BOND, 0)
    assert _books_match(c)[n3.lower()]["earned"] == 0


def test_a_verdict_is_challenged_once_and_its_window_is_bounded(c: Court) -> None:
    """48 challenges a second before the end kept a true verdict open 49 hours; now the first
    challenge costs a deposit and sets the end, and nothing moves it after."""
    w, fed, p2, n3 = c.w, c.w.fed, c.w.p2, c.w.n3.address
    fraud = c.submit(p2, n3, "fraud", 10)
    at = w.backend.now()
    c.judge.hard_invalidate(fraud)
    c.rogue.vote(fraud, uphold=True)  # confirmed: stands an hour after the verdict
    w.backend.advance_time(DISPUTE - 5)
    until = p2.challenge(fraud).event("VerdictChallenged").args["until"]
    assert until <= at + DISPUTE + VOTE + 5
    w.backend.advance_time(VOTE - 10)
    w.expect_revert("work: already challenged", lambda: p2.challenge(fraud), check_funds=True)
    fed.rule(fraud, uphold=True)
    assert fed.dispute(fraud).until == until
    w.backend.advance_time(until - w.backend.now() + 1)
    fed.settle(fraud)  # the accuser's bond is free again a vote period after the hour
    assert c.judge.bond() == (BOND + STAKE, 0)
    assert _stake(c, p2) == 200 * TOKEN - PENALTY - STAKE


def test_bond_exhaustion_no_longer_gets_a_real_fraud_paid(c: Court) -> None:
    """Decoy frauds lock every validator's bond past the real fraud's window; now nothing of
    a provider under an open hard verdict is claimed, and an upheld one puts its unclaimed
    work under review, so the real fraud is caught after the decoys settle."""
    w, fed, p2, n3 = c.w, c.w.fed, c.w.p2, c.w.n3.address
    p2.add_stake(1000 * TOKEN)
    n2 = w.n2
    p2.add_node(n2, 1)
    p2.join_pool(*w.invite(w.pool, n2.address, nonce=40))
    for v in (c.rogue, c.judge):  # each keeps room for 3 verdicts
        v.withdraw_bond(BOND - 3 * VB)
    decoys = [c.submit(p2, n3, f"decoy-{i}", 1) for i in range(6)]
    for i, wid in enumerate(decoys):
        (c.rogue if i % 2 else c.judge).hard_invalidate(wid)
    real = c.submit(p2, n2.address, "real-fraud", 1000)
    w.expect_revert("stake: bond too low", lambda: c.judge.hard_invalidate(real))
    stake0 = _stake(c, p2)
    w.backend.advance_time(LOCK)  # past the real fraud's window, its lock
    w.expect_revert("work: under review", lambda: p2.claim([real]))  # decoys still open
    assert _books_match(c)[n2.address.lower()]["claimable"] == 0
    for wid in decoys:
        fed.settle(wid)
    w.expect_revert("work: under review", lambda: p2.claim([real]))
    c.judge.hard_invalidate(real)  # under review: its window reopened for the caught provider
    w.backend.advance_time(UNCONFIRMED + 1)
    fed.settle(real)
    assert fed.work(real).status == WorkStatus.HARD_INVALIDATED
    # the cheater paid 7 penalties and earned nothing: the real fraud's 1000 units are not paid
    assert stake0 == 1200 * TOKEN and _stake(c, p2) == stake0 - 7 * PENALTY
    assert not fed.claimable(real)
    assert _books_match(c)[n2.address.lower()]["earned"] == 0


def test_many_overturned_verdicts_never_freeze_honest_rewards(c: Court) -> None:
    """Sixteen overturned verdicts kept an honest item 'disputed' for good; the contract now
    skips any number of them (union-find) to the first that decides, and the books agree."""
    w, fed, p1, n1 = c.w, c.w.fed, c.w.p1, c.w.n1.address
    c.rogue.post_bond(1000 * TOKEN)
    first = c.submit(p1, n1, "first", 5)
    others = [c.submit(p1, n1, f"other-{i}", 1) for i in range(18)]
    for wid in others[:17]:
        c.rogue.hard_invalidate(wid)
        c.judge.vote(wid, uphold=False)  # a challenge by vote, nobody upholds
    c.rogue.hard_invalidate(others[17])  # one more, left open
    w.backend.advance_time(DISPUTE + VOTE)
    for wid in reversed(others[:17]):  # settled out of order
        fed.settle(wid)
    # past 17 overturned verdicts the open one is found: the item waits for it
    assert fed.standing(first) == Standing.DISPUTED
    c.judge.vote(others[17], uphold=False)
    w.backend.advance_time(VOTE + 1)
    fed.settle(others[17])
    assert fed.standing(first) == Standing.CLEAR
    w.backend.advance_time(LOCK)
    assert fed.claimable(first)
    assert _books_match(c)[n1.lower()]["claimable"] == 23 * RATE
    assert p1.claim([first, *others]).event("RewardsClaimed").args["amount"] == 23 * RATE
    assert c.rogue.bond() == (2 * BOND - 18 * VB, 0)
    assert c.judge.bond() == (BOND, 0)


def test_dispute_parameters_are_fixed_when_a_verdict_is_made(c: Court) -> None:
    """Raising the quorum after a true verdict was upheld by votes, or the penalty after an
    accusation, no longer reaches that verdict."""
    w, fed, p2, n3 = c.w, c.w.fed, c.w.p2, c.w.n3.address
    fraud = c.submit(p2, n3, "fraud", 10)
    c.judge.hard_invalidate(fraud)
    p2.challenge(fraud)
    c.rogue.vote(fraud, uphold=True)
    fed.set_dispute_params(VB, DISPUTE, VOTE, 2)
    fed.set_work_params(PARAMS.invalidation_window, LOCK, 150 * TOKEN)
    d = fed.dispute(fraud)
    assert (d.quorum, d.penalty, d.period, d.vote_period) == (1, PENALTY, DISPUTE, VOTE)
    w.backend.advance_time(DISPUTE + VOTE)
    r = fed.settle(fraud)
    assert r.event("Slashed").args["amount"] == PENALTY
    assert fed.work(fraud).status == WorkStatus.HARD_INVALIDATED


def test_keep_grants_strips_the_outgoing_keys_own_pool_appointment(c: Court) -> None:
    w, fed = c.w, c.w.fed
    fed.set_pool_manager(w.pool, fed.address)  # the outgoing key appoints itself
    new = key("fed2")
    w.backend.fund(new.address, 10**21)
    fed.propose_federator(new.address)
    nf = fed.as_(new)
    nf.accept_federator(keep_grants=True)
    assert int(fed.pool_manager(w.pool), 16) == 0
    assert fed.pool_manager(w.pending_pool) == w.manager.address  # other grants kept
    assert w.fed.address not in [m for _, m in nf.handover_roles()["pool_managers"]]
    args = (w.pool, w.n2.address, 1, w.backend.now() + 600)
    sig = fed.sign_invite(*args)
    w.p2.add_node(w.n2, 1)
    w.expect_revert("pools: bad invite signature", lambda: w.p2.join_pool(*args, sig))
    nf.set_pool_manager(w.pool, fed.address)  # re-appointed by the new federator: valid
    assert fed.pool_manager(w.pool) == fed.address
    w.p2.join_pool(*args, sig)
