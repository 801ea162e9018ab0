"""Work and reward rules: submission, invalidation (hard and soft), lock period, claims."""

from __future__ import annotations

import pytest

from meshrl.protocol import WorkStatus, work_id

from .helpers import PARAMS, RATE, TOKEN, World, file_hash

LOCK, WINDOW = PARAMS.lock_period, PARAMS.invalidation_window


def _submit(world: World, label: str, units: int = 10) -> bytes:
    """Submit a file from n1; returns the work id."""
    f = file_hash(label)
    world.p1.submit_work(world.pool, world.n1.address, f, units)
    return world.fed.work_id(world.n1.address, f)


def test_submit_records_work_and_reward(world: World) -> None:
    f = file_hash("a")
    r = world.p1.submit_work(world.pool, world.n1.address, f, 12)
    args = r.event("WorkSubmitted").args
    assert args["reward"] == 12 * RATE and args["file_sha256"] == f
    wid = args["work_id"]
    assert wid == world.fed.contract.functions.work_id(world.n1.address, f).call()
    assert wid == work_id(world.n1.address, f)  # the off-chain half agrees
    with pytest.raises(ValueError, match="32 bytes"):
        work_id(world.n1.address, f[:31])
    w = world.fed.work(wid)
    assert (w.pool, w.node, w.provider, w.units, w.status) == (
        world.pool,
        world.n1.address,
        world.p1.address,
        12,
        WorkStatus.SUBMITTED,
    )
    assert w.unlock_at == w.submitted_at + LOCK
    assert world.fed.contract.functions.pool_work_units(world.pool).call() == 12


def test_submit_rules(world: World) -> None:
    p1, pool, n1 = world.p1, world.pool, world.n1.address
    _submit(world, "dup")
    world.expect_revert(
        "work: duplicate file", lambda: p1.submit_work(pool, n1, file_hash("dup"), 1)
    )
    world.expect_revert("work: zero units", lambda: p1.submit_work(pool, n1, file_hash("z"), 0))
    world.expect_revert("work: empty hash", lambda: p1.submit_work(pool, n1, bytes(32), 1))
    world.expect_revert(
        "work: node not in pool", lambda: p1.submit_work(world.pending_pool, n1, file_hash("x"), 1)
    )
    world.fed.complete_pool(pool)
    world.expect_revert(
        "work: pool not active", lambda: p1.submit_work(pool, n1, file_hash("y"), 1)
    )


def test_submit_for_someone_elses_node_reverts(world: World) -> None:
    for who in (world.p2, world.stranger, world.client(world.n1), world.manager):
        world.expect_revert(
            "work: not node provider",
            lambda w=who: w.submit_work(world.pool, world.n1.address, file_hash("steal"), 5),
            check_funds=True,
        )


def test_claim_after_lock_once(world: World) -> None:
    f = _submit(world, "c", units=40)
    world.expect_revert("work: locked", lambda: world.p1.claim([f]), check_funds=True)
    assert not world.fed.claimable(f)
    world.backend.advance_time(LOCK + 1)
    assert world.fed.claimable(f)
    world.expect_revert("work: not your work", lambda: world.p2.claim([f]), check_funds=True)
    before = world.fed.balance(world.p1.address)
    r = world.p1.claim([f])
    assert r.event("RewardsClaimed").args["amount"] == 40 * RATE
    assert world.fed.balance(world.p1.address) == before + 40 * RATE
    assert world.fed.work(f).status == WorkStatus.CLAIMED
    world.expect_revert("work: already claimed", lambda: world.p1.claim([f]), check_funds=True)


def test_claim_same_item_twice_in_one_call_reverts(world: World) -> None:
    f, g = _submit(world, "d1"), _submit(world, "d2")
    world.backend.advance_time(LOCK + 1)
    world.expect_revert(
        "work: already claimed", lambda: world.p1.claim([f, g, f]), check_funds=True
    )
    world.p1.claim([f, g])
    assert world.fed.totals()["claimed"] == 20 * RATE


def test_soft_invalidate_voids_without_slash(world: World) -> None:
    f, g = _submit(world, "s1"), _submit(world, "s2")
    stake = world.fed.provider(world.p1.address).stake
    r = world.validator.soft_invalidate(f)
    assert r.event("WorkInvalidated").args["hard"] is False
    assert world.fed.work(f).status == WorkStatus.SOFT_INVALIDATED
    assert world.fed.provider(world.p1.address).stake == stake
    assert world.fed.node(world.n1.address).pool == world.pool  # not ejected
    world.backend.advance_time(LOCK + 1)
    world.expect_revert("work: invalidated", lambda: world.p1.claim([f]))
    world.p1.claim([g])  # other work is untouched


def test_hard_invalidate_slashes_ejects_and_wipes_locked_rewards(world: World) -> None:
    old = _submit(world, "old")
    world.backend.advance_time(LOCK + 1)  # `old` is unlocked: not wiped
    locked, bad = _submit(world, "locked"), _submit(world, "bad")
    stake = world.fed.provider(world.p1.address).stake
    r = world.validator.hard_invalidate(bad)
    assert r.event("WorkInvalidated").args["slashed"] == PARAMS.slash_penalty
    assert world.fed.provider(world.p1.address).stake == stake - PARAMS.slash_penalty
    assert world.fed.node(world.n1.address).pool == 0  # ejected
    assert world.fed.work(bad).status == WorkStatus.HARD_INVALIDATED
    world.backend.advance_time(LOCK + 1)
    world.expect_revert("work: rewards wiped", lambda: world.p1.claim([locked]))
    world.expect_revert("work: invalidated", lambda: world.p1.claim([bad]))
    assert world.p1.claim([old]).event("RewardsClaimed").args["amount"] == 10 * RATE
    # after rejoining, new work belongs to a new generation and is paid
    world.p1.join_pool(*world.invite(world.pool, world.n1.address, nonce=2))
    new = _submit(world, "new")
    world.backend.advance_time(LOCK + 1)
    world.p1.claim([new])
    world.expect_revert("work: rewards wiped", lambda: world.p1.claim([locked]))


def test_invalidation_rules(world: World) -> None:
    f = _submit(world, "i")
    for who in (world.stranger, world.fed, world.manager, world.p1):
        world.expect_revert(
            "roles: not validator", lambda w=who: w.hard_invalidate(f), check_funds=True
        )
        world.expect_revert("roles: not validator", lambda w=who: w.soft_invalidate(f))
    world.expect_revert(
        "work: unknown work", lambda: world.validator.hard_invalidate(file_hash("nope"))
    )
    world.backend.advance_time(WINDOW + 1)
    world.expect_revert(
        "work: invalidation window closed",
        lambda: world.validator.hard_invalidate(f),
        check_funds=True,
    )
    g = _submit(world, "j")
    world.validator.soft_invalidate(g)
    world.expect_revert("work: not pending", lambda: world.validator.hard_invalidate(g))


def test_reward_rate_applies_to_new_work(world: World) -> None:
    f = _submit(world, "r1")
    world.fed.set_reward_rate(world.pool, 3 * RATE)
    g = _submit(world, "r2")
    assert (world.fed.work(f).reward, world.fed.work(g).reward) == (10 * RATE, 30 * RATE)


def test_work_params(world: World) -> None:
    world.expect_revert(
        "work: lock shorter than window", lambda: world.fed.set_work_params(100, 99, TOKEN)
    )
    world.fed.set_work_params(100, 100, TOKEN)
    assert world.fed.contract.functions.lock_period().call() == 100
