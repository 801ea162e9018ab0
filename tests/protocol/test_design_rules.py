"""The design points settled in issue 12 (each now a rule), and the guards added for attacks of
the same kinds as the eight exploits (stake coverage, hand-over, invites, proofs, bounds)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from meshrl.protocol import ProtocolParams

from .helpers import PARAMS, RATE, TOKEN, World, file_hash

WINDOW, LOCK = PARAMS.invalidation_window, PARAMS.lock_period


def test_unbonding_delay_never_shorter_than_invalidation_window(world: World) -> None:
    fed = world.fed
    assert fed.contract.functions.min_unbonding_delay().call() == WINDOW
    world.expect_revert(
        "stake: unbonding shorter than window",
        lambda: fed.set_stake_params(PARAMS.min_stake, PARAMS.stake_per_unit, WINDOW - 1),
    )
    world.expect_revert(
        "work: window longer than unbonding",
        lambda: fed.set_work_params(PARAMS.unbonding_delay + 1, 10**9, TOKEN),
    )
    fed.set_stake_params(PARAMS.min_stake, PARAMS.stake_per_unit, WINDOW)  # equal is fine
    with pytest.raises(ValidationError, match="unbonding_delay must be >= invalidation_window"):
        ProtocolParams(unbonding_delay=60, invalidation_window=3600)


def test_cheater_cannot_withdraw_before_judgment(world: World) -> None:
    p2, n3, pool = world.p2, world.n3.address, world.pool
    p2.join_pool(*world.invite(pool, n3, nonce=5))
    f = file_hash("cheat-then-run")
    p2.submit_work(pool, n3, f, 5)
    p2.leave_pool(n3)
    p2.remove_node(n3)
    p2.request_unstake(200 * TOKEN)  # everything, right after cheating
    world.backend.advance_time(WINDOW - 60)
    world.expect_revert("stake: still unbonding", p2.withdraw)
    r = world.validator.hard_invalidate(world.fed.work_id(n3, f))
    assert r.event("Slashed").args["amount"] == PARAMS.slash_penalty  # taken from unbonding
    assert world.fed.provider(p2.address).unbonding == 200 * TOKEN - PARAMS.slash_penalty


def test_hard_invalidation_ejects_from_the_pool_of_the_work_only(world: World) -> None:
    n1, pool, other = world.n1.address, world.pool, world.pending_pool
    f = file_hash("done-in-pool-1")
    world.p1.submit_work(pool, n1, f, 5)
    world.fed.start_pool(other)
    world.p1.leave_pool(n1)
    world.p1.join_pool(*world.invite(other, n1, nonce=2))
    world.validator.hard_invalidate(world.fed.work_id(n1, f))
    assert world.fed.node(n1).pool == other  # the other pool's manager has not judged it
    world.p1.submit_work(other, n1, file_hash("new-generation"), 5)  # and it keeps working
    g = file_hash("in-pool-1-again")
    world.p1.leave_pool(n1)
    world.p1.join_pool(*world.invite(pool, n1, nonce=3))
    world.p1.submit_work(pool, n1, g, 5)
    r = world.validator.hard_invalidate(world.fed.work_id(n1, g))
    assert r.event("NodeEjected").args["pool"] == pool and world.fed.node(n1).pool == 0


def test_wipe_covers_every_generation_before_the_judgment_only(world: World) -> None:
    # issue 25: an ejection (or a remove + re-add) opens a new node generation, but the
    # judgment still wipes the provider's unchecked items of the node made before it
    n1, pool = world.n1.address, world.pool
    ids = {}
    for label in ("a", "fraud"):
        world.p1.submit_work(pool, n1, file_hash(label), 5)
        ids[label] = world.fed.work_id(n1, file_hash(label))
    world.manager.eject_node(pool, n1)  # closes the generation (no wipe by itself)
    world.p1.join_pool(*world.invite(pool, n1, nonce=2))
    world.p1.submit_work(pool, n1, file_hash("b"), 5)
    ids["b"] = world.fed.work_id(n1, file_hash("b"))
    world.validator.hard_invalidate(ids["fraud"])
    assert world.fed.node(n1).pool == 0  # same provider, same pool: ejected
    world.p1.join_pool(*world.invite(pool, n1, nonce=3))
    world.p1.submit_work(pool, n1, file_hash("c"), 5)  # after the judgment: not reached
    ids["c"] = world.fed.work_id(n1, file_hash("c"))
    world.backend.advance_time(LOCK + 1)
    for label in ("a", "b"):
        world.expect_revert("work: rewards wiped", lambda w=ids[label]: world.p1.claim([w]))
    assert world.fed.claimable(ids["c"])
    assert world.p1.claim([ids["c"]]).event("RewardsClaimed").args["amount"] == 5 * RATE


def test_pool_may_set_a_submission_interval(world: World) -> None:
    p1, pool, n1 = world.p1, world.pool, world.n1.address
    world.expect_revert(
        "pools: interval too long", lambda: world.manager.set_pool_limits(pool, 10, 86401)
    )
    r = world.manager.set_pool_limits(pool, 10, 600)
    assert r.event("PoolLimitsSet").args["min_interval"] == 600
    assert (world.fed.pool(pool).max_units, world.fed.pool(pool).min_interval) == (10, 600)
    p1.submit_work(pool, n1, file_hash("first"), 10)
    assert world.fed.last_submission(n1) == world.backend.now()
    world.expect_revert(
        "work: too frequent", lambda: p1.submit_work(pool, n1, file_hash("second"), 1)
    )
    world.backend.advance_time(600)
    p1.submit_work(pool, n1, file_hash("second"), 1)


def test_tokens_sent_to_the_protocol_can_be_recovered(world: World) -> None:
    fed, protocol = world.fed, world.fed.contract.address
    world.stranger.transfer(protocol, 7 * TOKEN)
    world.fed.slash(world.p1.address, 3 * TOKEN)
    world.expect_revert(
        "roles: not federator", lambda: world.stranger.recover_tokens(world.stranger.address)
    )
    held = fed.balance(protocol)
    before = fed.balance(world.manager.address)
    r = fed.recover_tokens(world.manager.address)
    assert r.event("TokensRecovered").args["amount"] == 7 * TOKEN
    assert fed.balance(world.manager.address) == before + 7 * TOKEN
    totals = fed.totals()
    assert (
        fed.balance(protocol)
        == held - 7 * TOKEN
        == sum(totals[k] for k in ("stake", "unbonding", "slashed", "bonds"))
    )
    assert fed.recover_tokens(world.manager.address).event("TokensRecovered").args["amount"] == 0


def test_old_federator_keeps_its_power_until_acceptance_and_can_cancel(world: World) -> None:
    fed, s = world.fed, world.stranger
    fed.propose_federator(s.address)
    world.expect_revert("roles: not federator", lambda: s.set_validator(s.address, True))
    fed.propose_federator("0x" + "0" * 40)  # cancelled
    world.expect_revert("roles: not proposed federator", s.accept_federator)
    fed.set_validator(s.address, True)
    assert fed.is_validator(s.address)


def test_node_move_voids_invites_of_its_old_chapter(world: World) -> None:
    n3, pool = world.n3, world.pool
    spare = world.invite(pool, n3.address, nonce=90)
    world.p2.remove_node(n3.address)
    world.p1.add_node(n3, 1)
    world.expect_revert("pools: bad invite signature", lambda: world.p1.join_pool(*spare))
    world.p1.join_pool(*world.invite(pool, n3.address, nonce=91))


def test_blacklist_voids_invites_for_other_pools(world: World) -> None:
    n1, other = world.n1.address, world.pending_pool
    world.fed.start_pool(other)
    spare = world.invite(other, n1, nonce=5)
    world.manager.blacklist_node(world.pool, n1)
    world.expect_revert("pools: bad invite signature", lambda: world.p1.join_pool(*spare))


def test_compute_units_and_rates_are_bounded(world: World) -> None:
    world.fed.set_stake_params(PARAMS.min_stake, 0, PARAMS.unbonding_delay)
    world.expect_revert(
        "nodes: too many compute units", lambda: world.p1.add_node(world.n2, 2**64 + 1)
    )
    world.p1.add_node(world.n2, 2**64)
    world.expect_revert(
        "pools: reward rate too high",
        lambda: world.fed.create_pool(world.domain, world.manager.address, 2**128 + 1),
    )
    world.expect_revert(
        "pools: bad max units",
        lambda: world.fed.create_pool(world.domain, world.manager.address, 1, 0),
    )


def test_new_federator_can_replace_a_pool_manager_key(world: World) -> None:
    # The old federator often manages its own pools; a hand-over must be able to end that too.
    pool, n3, old_manager = world.pool, world.n3.address, world.manager
    spare = world.invite(pool, n3, nonce=95)
    world.expect_revert(
        "roles: not federator", lambda: old_manager.set_pool_manager(pool, old_manager.address)
    )
    r = world.fed.set_pool_manager(pool, world.stranger.address)
    assert r.event("PoolManagerSet").args["manager"] == world.stranger.address
    world.expect_revert(
        "pools: not pool admin", lambda: old_manager.eject_node(pool, world.n1.address)
    )
    world.expect_revert("pools: bad invite signature", lambda: world.p2.join_pool(*spare))
    expiry = world.backend.now() + 600
    world.p2.join_pool(pool, n3, 1, expiry, world.stranger.sign_invite(pool, n3, 1, expiry))
