"""The smaller design holes of issue 25, each replayed as the attack (or the wrong books) it
allowed: on the contracts before the fix each test failed at the step marked "was:"."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eth_utils import to_checksum_address

from meshrl.orchestrator.books import Books
from meshrl.protocol.history import pool_history

from .helpers import PARAMS, RATE, TOKEN, World, file_hash

WINDOW, LOCK = PARAMS.invalidation_window, PARAMS.lock_period
DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
ZERO = "0x" + "0" * 40


def _wid(world: World, node: str, label: str) -> bytes:
    return world.fed.work_id(node, file_hash(label))


def _submit(world: World, provider, pool: int, node: str, label: str, units: int = 5) -> bytes:
    provider.submit_work(pool, node, file_hash(label), units)
    return _wid(world, node, label)


# (a) a hand-over lists and by default revokes the roles of the outgoing tenure


def test_handover_lists_and_revokes_the_old_federators_grants(world: World) -> None:
    old, new, pool = world.fed, world.stranger, world.pool
    # before leaving, the old federator grants itself every right it can
    old.set_validator(old.address)
    old.set_minter(old.address, True)
    old.set_pool_manager(world.pending_pool, old.address)
    old.propose_federator(new.address)
    roles = old.handover_roles()
    assert roles["validators"] == sorted([old.address, world.validator.address])
    assert roles["minters"] == [old.address]
    assert roles["pool_managers"] == [(pool, world.manager.address),
                                      (world.pending_pool, old.address)]
    assert roles["held_by_federator"] == [old.address]
    r = new.accept_federator()
    assert r.event("FederatorTransferred").args["revoked"] is True
    assert [e.args["minter"] for e in r.events if e.name == "MinterSet"] == [old.address]
    token = old.token.functions
    supply = token.totalSupply().call()
    # was: the old key minted 1e9 tokens after the hand-over
    world.expect_revert("token: not minter", lambda: old._send(token.mint(old.address, 10**27)))
    assert token.totalSupply().call() == supply
    f = _submit(world, world.p1, pool, world.n1.address, "after-hand-over")
    for v in (old, world.validator):  # its own right and the one it granted
        world.expect_revert("roles: not validator", lambda v=v: v.hard_invalidate(f))
    world.expect_revert("pools: not pool admin", lambda: old.start_pool(world.pending_pool))
    world.expect_revert("pools: not pool admin",
                        lambda: world.manager.eject_node(pool, world.n1.address))
    assert new.pool_manager(pool) == ZERO and new.granted_minters() == []
    spare = world.invite(pool, world.n3.address, nonce=40)  # signed by the revoked manager
    world.expect_revert("pools: bad invite signature", lambda: world.p2.join_pool(*spare))
    # the new federator re-grants whom it trusts
    new.set_pool_manager(pool, world.manager.address)
    new.set_validator(world.validator.address)
    world.p2.join_pool(*world.invite(pool, world.n3.address, nonce=41))
    world.validator.soft_invalidate(f)
    assert new.handover_roles()["validators"] == [world.validator.address]


def test_handover_that_keeps_grants_still_strips_the_old_key(world: World) -> None:
    old, new = world.fed, world.stranger
    old.set_validator(old.address)
    old.set_minter(old.address, True)
    old.set_minter(world.manager.address, True)
    old.propose_federator(new.address)
    r = new.accept_federator(keep_grants=True)
    assert r.event("FederatorTransferred").args["revoked"] is False
    assert not new.is_validator(old.address) and new.is_validator(world.validator.address)
    assert new.granted_minters() == [world.manager.address]
    token = old.token.functions
    world.expect_revert("token: not minter", lambda: old._send(token.mint(old.address, 1)))
    world.manager._send(token.mint(world.manager.address, 1))  # a kept grant
    assert new.pool_manager(world.pool) == world.manager.address


# (b) a judgment wipes the provider's unchecked items across generations of the node


def test_remove_and_readd_of_a_node_does_not_escape_the_wipe(world: World) -> None:
    p1, n1, pool = world.p1, world.n1, world.pool
    fraud = _submit(world, p1, pool, n1.address, "fraud")
    p1.leave_pool(n1.address)
    p1.remove_node(n1.address)  # a new generation of the node ...
    p1.add_node(n1, 5)
    p1.join_pool(*world.invite(pool, n1.address, nonce=2))
    split = _submit(world, p1, pool, n1.address, "unchecked-after-split", 10)
    assert world.fed.node_generation(n1.address) == 1
    r = world.validator.hard_invalidate(fraud)
    assert r.event("RewardsWiped").args["index"] == 0
    world.backend.advance_time(LOCK + 1)
    # was: the item of the new generation was paid
    world.expect_revert("work: rewards wiped", lambda: p1.claim([split]), check_funds=True)
    assert not world.fed.claimable(split)


# (c) unbonding waits for the window that can still judge the provider's last submission


def test_unbonding_waits_for_the_window_of_the_last_submission(world: World) -> None:
    fed, p2, n3, pool, val = world.fed, world.p2, world.n3.address, world.pool, world.validator
    fed.set_stake_params(PARAMS.min_stake, PARAMS.stake_per_unit, WINDOW)  # delay == window
    p2.join_pool(*world.invite(pool, n3, nonce=5))
    p2.request_unstake(100 * TOKEN)  # unlocks in one hour
    # governance lengthens the window (and the delay for later requests) ...
    fed.set_stake_params(PARAMS.min_stake, PARAMS.stake_per_unit, 3 * WINDOW)
    fed.set_work_params(3 * WINDOW, LOCK, 150 * TOKEN)
    fraud = _submit(world, p2, pool, n3, "fraud-under-the-long-window")  # judgeable 3 hours
    assert fed.contract.functions.judgeable_until(p2.address).call() == \
        fed.work(fraud).submitted_at + 3 * WINDOW
    world.backend.advance_time(WINDOW + 1)
    # was: the 100 unbonding tokens left here, and the judgment below slashed only 100
    world.expect_revert("stake: work still judgeable", p2.withdraw, check_funds=True)
    world.backend.advance_time(WINDOW)
    r = val.hard_invalidate(fraud)
    assert r.event("Slashed").args["amount"] == 150 * TOKEN
    assert (fed.provider(p2.address).stake, fed.provider(p2.address).unbonding) == (0, 50 * TOKEN)
    world.backend.advance_time(WINDOW)
    assert p2.withdraw().event("Withdrawn").args["amount"] == 50 * TOKEN


def test_a_closed_window_stays_closed_when_governance_lengthens_it(world: World) -> None:
    # windows are fixed at submission: the unbonding delay then always covers them
    fed, p1, n1, pool = world.fed, world.p1, world.n1.address, world.pool
    old = _submit(world, p1, pool, n1, "under-the-short-window")
    fed.set_work_params(2 * WINDOW, LOCK, PARAMS.slash_penalty)
    world.backend.advance_time(WINDOW + 1)
    world.expect_revert("work: invalidation window closed",
                        lambda: world.validator.hard_invalidate(old))
    assert fed.work(old).judge_until == fed.work(old).submitted_at + WINDOW


# (d) the wipe of a node's rewards for fraud in another pool is an event the books follow


def _books(world: World, pool: int) -> Books:
    db = sqlite3.connect(":memory:")
    db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                     "CREATE TABLE nodes (address TEXT PRIMARY KEY, provider TEXT NOT NULL);")
    books = Books(db, pool)
    fed, providers = world.fed, {}
    events = fed.events().poll()
    times = {e.block: int(world.backend.w3.eth.get_block(e.block)["timestamp"]) for e in events}
    for e in events:
        if e.name == "NodeJoined" and e.args["pool"] == pool:
            node = e.args["node"]
            provider = fed.node(node).provider
            providers[node.lower()] = provider
            db.execute("INSERT OR IGNORE INTO nodes VALUES (?, ?)", (node, provider))
            books.joined(node, provider)
        books.apply(e, times[e.block] if books.needs_time(e) else None, providers)
    stakes = {p: fed.provider(to_checksum_address(p)).stake for p in books.pending_stakes()}
    books.resolve(stakes, {})
    books.set_chain_time(world.backend.now())
    return books


def test_wipe_for_fraud_in_another_pool_reaches_the_books(world: World) -> None:
    p1, n1, pool, other = world.p1, world.n1.address, world.pool, world.pending_pool
    world.fed.start_pool(other)
    fraud = _submit(world, p1, pool, n1, "fraud-in-pool-1")
    p1.leave_pool(n1)
    p1.join_pool(*world.invite(other, n1, nonce=2))
    honest_looking = _submit(world, p1, other, n1, "unchecked-in-pool-2", 20)
    r = world.validator.hard_invalidate(fraud)
    wipe = r.event("RewardsWiped").args  # was: no event; the books kept the reward claimable
    assert (wipe["provider"], wipe["node"], wipe["index"]) == (p1.address, n1, 0)
    world.backend.advance_time(LOCK + 1)
    h = pool_history(world.fed, other)
    [w] = h["works"]
    assert (w["work_id"], w["wiped"], w["claimable"]) == (honest_looking.hex(), True, False)
    assert h["rewards"][n1.lower()] == {"earned": 0, "claimable": 0, "claimed": 0}
    m = _books(world, other).money()[n1.lower()]
    assert (m.earned, m.claimable, m.claimed) == (0, 0, 0)
    assert m.stake == world.fed.provider(p1.address).stake == 250 * TOKEN
    # and in pool 1 the books agree with the chain too: the fraud's reward is gone, 50 slashed
    m1 = _books(world, pool).money()[n1.lower()]
    h1 = pool_history(world.fed, pool)["rewards"][n1.lower()]
    assert (m1.earned, m1.claimable, m1.slashed) == (h1["earned"], h1["claimable"], 50 * TOKEN)


def test_books_follow_items_left_clear_by_a_wipe(world: World) -> None:
    p1, n1, pool = world.p1, world.n1.address, world.pool
    early = _submit(world, p1, pool, n1, "checked-by-time", 7)  # its window closes first
    world.backend.advance_time(WINDOW + 1)
    fraud = _submit(world, p1, pool, n1, "fraud")
    open_item = _submit(world, p1, pool, n1, "still-unchecked", 3)
    world.validator.hard_invalidate(fraud)
    world.backend.advance_time(LOCK + 1)
    assert world.fed.claimable(early) and not world.fed.claimable(open_item)
    m = _books(world, pool).money()[n1.lower()]
    h = pool_history(world.fed, pool)["rewards"][n1.lower()]
    assert (m.earned, m.claimable) == (h["earned"], h["claimable"]) == (7 * RATE, 7 * RATE)


# (e) approve overwrites: clients change allowances with increase / decrease


def test_client_never_overwrites_a_live_allowance(world: World) -> None:
    p1, protocol = world.p1, world.fed.contract.address
    p1.increase_allowance(protocol, 7 * TOKEN)  # some other use of the allowance in flight
    p1.add_stake(5 * TOKEN)
    # was: add_stake approved 5 (overwriting the 7) and spent it, leaving 0
    assert p1.allowance(p1.address, protocol) == 7 * TOKEN
    text = DOCS.read_text()
    assert "must use `increaseAllowance` / `decreaseAllowance`" in text


# (f) a wipe never reaches work whose invalidation window has closed


def test_wipe_never_reaches_work_whose_window_has_closed(world: World) -> None:
    p1, n1, pool = world.p1, world.n1.address, world.pool
    checked = _submit(world, p1, pool, n1, "window-closed", 10)
    world.backend.advance_time(2 * WINDOW)  # its window closed; still locked (a day)
    fraud = _submit(world, p1, pool, n1, "fraud")
    world.validator.hard_invalidate(fraud)
    world.backend.advance_time(LOCK + 1)
    # was: "work: rewards wiped" (the item unlocked after the judgment)
    assert world.p1.claim([checked]).event("RewardsClaimed").args["amount"] == 10 * RATE
