"""The eight exploits of the attack review (issue 12), each replayed against the contracts.

Every test is the attack itself: on the contracts before the hardening the attacker's step
succeeded (or the honest step failed), so the test failed; now the attack is refused and the
honest party keeps what it earned.
"""

from __future__ import annotations

from meshrl.protocol import WorkStatus, sign_ownership

from .helpers import PARAMS, TOKEN, World, file_hash

LOCK = PARAMS.lock_period


def _attacker_in_pool(world: World) -> None:
    """p2 (node n3) joins the pool the honest provider p1 (node n1) works in."""
    world.p2.join_pool(*world.invite(world.pool, world.n3.address, nonce=50))


def test_1_copied_file_hash_blocks_nobody_and_earns_nothing(world: World) -> None:
    _attacker_in_pool(world)
    f = file_hash("honest-rollout")
    # The attacker saw the honest transaction in the mempool and got in first.
    world.p2.submit_work(world.pool, world.n3.address, f, 10)
    # The honest submission still goes through: the work is bound to the submitting node.
    r = world.p1.submit_work(world.pool, world.n1.address, f, 10)
    honest = r.event("WorkSubmitted").args["work_id"]
    copied = world.fed.work_id(world.n3.address, f)
    assert honest == world.fed.work_id(world.n1.address, f) != copied
    # The validator sees whose node the copy claims to be from (the file names n1) and voids it.
    assert world.fed.work(copied).node == world.n3.address
    stake = world.fed.provider(world.p2.address).stake
    world.validator.hard_invalidate(copied)
    assert world.fed.provider(world.p2.address).stake == stake - PARAMS.slash_penalty
    world.backend.advance_time(LOCK + 1)
    world.expect_revert("work: invalidated", lambda: world.p2.claim([copied]), check_funds=True)
    assert world.p1.claim([honest]).event("RewardsClaimed").args["amount"] > 0
    # a node still cannot submit the same file twice
    world.expect_revert(
        "work: duplicate file", lambda: world.p1.submit_work(world.pool, world.n1.address, f, 1)
    )


def test_2_units_are_bounded_and_no_sum_can_be_filled(world: World) -> None:
    p1, pool, n1 = world.p1, world.pool, world.n1.address
    supply = world.fed.token.functions.totalSupply().call()
    for units in (10**30, 2**255, None):
        units = units or world.fed.pool(pool).max_units + 1
        world.expect_revert(
            "work: units above pool maximum",
            lambda u=units: p1.submit_work(pool, n1, file_hash(f"huge-{u}"), u),
            check_funds=True,
        )
    # The manager bounds units per file, never beyond 2**64; the federator bounds the rate by
    # 2**128, so a reward fits 2**192 and no counter a user grows can reach 2**256.
    world.expect_revert("pools: bad max units", lambda: world.manager.set_pool_limits(pool, 0))
    world.expect_revert(
        "pools: bad max units", lambda: world.manager.set_pool_limits(pool, 2**64 + 1)
    )
    world.expect_revert(
        "pools: not pool admin", lambda: world.stranger.set_pool_limits(pool, 2**64)
    )
    world.expect_revert(
        "pools: reward rate too high", lambda: world.fed.set_reward_rate(pool, 2**128 + 1)
    )
    world.manager.set_pool_limits(pool, 2**64)
    world.fed.set_reward_rate(pool, 2**128)
    big = [p1.submit_work(pool, n1, file_hash(f"max-{i}"), 2**64) for i in range(3)]
    assert world.fed.contract.functions.pool_work_units(pool).call() == 3 * 2**64
    assert big[0].event("WorkSubmitted").args["reward"] == 2**192
    # a later ordinary submission in the same pool is not blocked
    world.fed.set_reward_rate(pool, 10**15)
    p1.submit_work(pool, n1, file_hash("ordinary"), 7)
    assert world.fed.token.functions.totalSupply().call() == supply


def test_3_slashed_below_requirement_cannot_work_or_earn(world: World) -> None:
    p1, pool, n1, n2 = world.p1, world.pool, world.n1.address, world.n2
    p1.submit_work(pool, n1, file_hash("earned-before"), 10)
    p1.add_node(n2, 3)  # 8 compute units: requires max(100, 80) = 100 tokens
    p1.join_pool(*world.invite(pool, n2.address, nonce=60))
    fraud = file_hash("fraud")
    p1.submit_work(pool, n2.address, fraud, 10)
    world.fed.set_work_params(PARAMS.invalidation_window, LOCK, 250 * TOKEN)
    world.validator.hard_invalidate(world.fed.work_id(n2.address, fraud))
    assert world.fed.provider(p1.address).stake == 50 * TOKEN < world.fed.required_stake(p1.address)
    # n1 is still in the pool, but its provider no longer covers its nodes
    world.expect_revert(
        "stake: below minimum for nodes",
        lambda: p1.submit_work(pool, n1, file_hash("after"), 10),
        check_funds=True,
    )
    world.backend.advance_time(LOCK + 1)
    old = world.fed.work_id(n1, file_hash("earned-before"))
    world.expect_revert("stake: below minimum for nodes", lambda: p1.claim([old]))
    world.expect_revert(
        "stake: below minimum for nodes",
        lambda: p1.join_pool(*world.invite(pool, n2.address, nonce=61)),
    )
    # topping up restores every right
    p1.add_stake(50 * TOKEN)
    p1.submit_work(pool, n1, file_hash("after"), 10)
    assert p1.claim([old]).event("RewardsClaimed").args["amount"] > 0


def test_4_old_federator_keeps_no_power_after_hand_over(world: World) -> None:
    old, new = world.fed, world.stranger
    world.expect_revert("roles: not proposed federator", new.accept_federator)
    old.propose_federator(new.address)
    assert old.federator() == old.address  # nothing moves before the acceptance
    world.expect_revert("roles: not proposed federator", world.p1.accept_federator)
    new.accept_federator()
    assert (new.federator(), new.pending_federator()) == (new.address, "0x" + "0" * 40)
    # the old key: no role action, no minting, no way to cut the protocol's minting right
    world.expect_revert("roles: not federator", lambda: old.mint(old.address, TOKEN))
    world.expect_revert("roles: not federator", lambda: old.set_minter(old.address, True))
    token = old.token.functions
    world.expect_revert("token: not minter", lambda: old._send(token.mint(old.address, TOKEN)))
    world.expect_revert(
        "token: not owner", lambda: old._send(token.set_minter(old.contract.address, False))
    )
    world.expect_revert("roles: not federator", lambda: old.set_validator(old.address, True))
    # the new federator holds every power, and cannot break reward minting either
    world.expect_revert(
        "treasury: protocol must mint", lambda: new.set_minter(new.contract.address, False)
    )
    new.mint(new.address, TOKEN)
    wid = world.fed.work_id(world.n1.address, file_hash("after-hand-over"))
    world.p1.submit_work(world.pool, world.n1.address, file_hash("after-hand-over"), 4)
    world.backend.advance_time(LOCK + 1)
    assert world.p1.claim([wid]).event("RewardsClaimed").args["amount"] > 0


def test_5_ejection_voids_spare_invites_and_invites_expire(world: World) -> None:
    n3, pool = world.n3.address, world.pool
    first, spare = world.invite(pool, n3, nonce=70), world.invite(pool, n3, nonce=71)
    world.p2.join_pool(*first)
    world.manager.eject_node(pool, n3)
    world.expect_revert(
        "pools: bad invite signature", lambda: world.p2.join_pool(*spare), check_funds=True
    )
    # the same after a hard invalidation
    world.p2.join_pool(*world.invite(pool, n3, nonce=72))
    spare = world.invite(pool, n3, nonce=73)
    f = file_hash("ejected-by-judgment")
    world.p2.submit_work(pool, n3, f, 5)
    world.validator.hard_invalidate(world.fed.work_id(n3, f))
    world.expect_revert("pools: bad invite signature", lambda: world.p2.join_pool(*spare))
    # an invite is usable for at most a day before its expiry
    far = world.invite(pool, n3, nonce=74, expiry=world.backend.now() + 2 * 86400)
    world.expect_revert("pools: invite lifetime too long", lambda: world.p2.join_pool(*far))
    world.backend.advance_time(86400 + 60)
    world.p2.join_pool(*far)  # now within a day of its expiry


def test_6_stale_ownership_proof_cannot_reclaim_a_moved_node(world: World) -> None:
    n2, p1, p2 = world.n2, world.p1, world.p2
    contract, chain = world.fed.contract.address, world.backend.chain_id
    gen = world.fed.node_generation(n2.address)
    old_proof = sign_ownership(n2.key, contract, chain, p1.address, gen)
    p1.add_node(n2, 1, signature=old_proof)
    p1.remove_node(n2.address)  # the node moves to p2 ...
    new_proof = sign_ownership(
        n2.key, contract, chain, p2.address, world.fed.node_generation(n2.address)
    )
    # ... and p1 tries to grab it back first with the proof it was once given
    world.expect_revert(
        "nodes: bad node signature",
        lambda: p1.add_node(n2, 1, signature=old_proof),
        check_funds=True,
    )
    p2.add_node(n2, 1, signature=new_proof)
    assert world.fed.node(n2.address).provider == p2.address


def test_7_judging_old_fraud_does_not_hit_the_nodes_new_provider(world: World) -> None:
    n1, pool = world.n1, world.pool
    fraud = file_hash("fraud-under-p1")
    world.p1.submit_work(pool, n1.address, fraud, 10)
    world.p1.leave_pool(n1.address)
    world.p1.remove_node(n1.address)
    world.p2.add_node(n1, 2)
    world.p2.join_pool(*world.invite(pool, n1.address, nonce=80))
    honest = world.fed.work_id(n1.address, file_hash("honest-under-p2"))
    world.p2.submit_work(pool, n1.address, file_hash("honest-under-p2"), 10)
    p1_stake = world.fed.provider(world.p1.address).stake
    p2_stake = world.fed.provider(world.p2.address).stake
    r = world.validator.hard_invalidate(world.fed.work_id(n1.address, fraud))
    assert r.event("Slashed").args["provider"] == world.p1.address
    assert world.fed.provider(world.p1.address).stake == p1_stake - PARAMS.slash_penalty
    assert world.fed.provider(world.p2.address).stake == p2_stake
    assert world.fed.node(n1.address).pool == pool  # p2's node stays in p2's pool
    world.backend.advance_time(LOCK + 1)
    assert world.fed.claimable(honest)
    world.p2.claim([honest])
    assert world.fed.work(honest).status == WorkStatus.CLAIMED


def test_8_allowance_change_cannot_be_front_run(world: World) -> None:
    owner, spender = world.p1, world.stranger
    take = spender.token.functions.transferFrom
    owner.approve(spender.address, 100)
    spender._send(take(owner.address, spender.address, 100))  # front-runs the change
    # lowering 100 -> 50 by a decrease refuses to hand out a fresh 50
    world.expect_revert(
        "token: allowance below decrease",
        lambda: owner.decrease_allowance(spender.address, 50),
        check_funds=True,
    )
    world.expect_revert(
        "token: allowance exceeded",
        lambda: spender._send(take(owner.address, spender.address, 50)),
    )
    owner.increase_allowance(spender.address, 30)
    owner.decrease_allowance(spender.address, 10)
    assert owner.allowance(owner.address, spender.address) == 20
