"""Stake rules: registration, minimum stake per compute unit, unbonding, slashing."""

from __future__ import annotations

from .helpers import PARAMS, TOKEN, World, key


def test_register_moves_tokens_into_stake(world: World) -> None:
    before = world.funds()
    r = world.stranger.register_provider(150 * TOKEN)
    info = world.fed.provider(world.stranger.address)
    assert info.registered and info.stake == 150 * TOKEN
    assert r.event("ProviderRegistered").args["amount"] == 150 * TOKEN
    after = world.funds()
    assert after[world.stranger.address] == before[world.stranger.address] - 150 * TOKEN
    assert after["protocol"] == before["protocol"] + 150 * TOKEN
    assert after["total_stake"] == before["total_stake"] + 150 * TOKEN


def test_register_below_minimum_or_twice_reverts(world: World) -> None:
    s = world.stranger
    s.approve(s.contract.address, 10**24)
    world.expect_revert(
        "stake: below minimum", lambda: s.register_provider(PARAMS.min_stake - 1, approve=False)
    )
    world.expect_revert(
        "stake: already registered",
        lambda: world.p1.register_provider(PARAMS.min_stake, approve=False),
    )


def test_register_without_allowance_reverts(world: World) -> None:
    world.expect_revert(
        "token: allowance exceeded",
        lambda: world.stranger.register_provider(200 * TOKEN, approve=False),
    )


def test_add_stake_needs_registration(world: World) -> None:
    world.stranger.approve(world.fed.contract.address, TOKEN)
    world.expect_revert("stake: not a provider", lambda: world.stranger.add_stake(TOKEN, False))
    world.p1.add_stake(TOKEN)
    assert world.fed.provider(world.p1.address).stake == 301 * TOKEN


def test_minimum_stake_scales_with_compute_units(world: World) -> None:
    # p1 stakes 300 and has 5 units: 5 * 10 = 50 required (min_stake 100 is the floor).
    assert world.p1.required_stake() == PARAMS.min_stake
    n = key("big-node")
    world.expect_revert("stake: below minimum for nodes", lambda: world.p1.add_node(n, 26))
    world.p1.add_node(n, 25)  # 30 units * 10 = 300 = the stake exactly
    assert world.p1.required_stake() == 300 * TOKEN
    assert world.fed.provider(world.p1.address).compute_units == 30


def test_unstake_keeps_minimum_for_nodes(world: World) -> None:
    p1 = world.p1
    world.expect_revert("stake: below minimum for nodes", lambda: p1.request_unstake(201 * TOKEN))
    world.expect_revert("stake: amount exceeds stake", lambda: p1.request_unstake(301 * TOKEN))
    world.expect_revert("stake: zero amount", lambda: p1.request_unstake(0))
    r = p1.request_unstake(200 * TOKEN)
    info = world.fed.provider(p1.address)
    assert (info.stake, info.unbonding) == (100 * TOKEN, 200 * TOKEN)
    assert r.event("UnstakeRequested").args["unlock_at"] == info.unlock_at
    assert info.unlock_at == world.backend.now() + PARAMS.unbonding_delay


def test_withdraw_only_after_unbonding_delay(world: World) -> None:
    p2 = world.p2
    world.p2.remove_node(world.n3.address)
    world.expect_revert("stake: nothing unbonding", p2.withdraw)
    p2.request_unstake(200 * TOKEN)
    world.expect_revert("stake: still unbonding", p2.withdraw, check_funds=True)
    world.backend.advance_time(PARAMS.unbonding_delay - 60)
    world.expect_revert("stake: still unbonding", p2.withdraw, check_funds=True)
    world.backend.advance_time(120)
    before = world.funds()
    p2.withdraw()
    after = world.funds()
    assert after[p2.address] == before[p2.address] + 200 * TOKEN
    assert after["total_unbonding"] == before["total_unbonding"] - 200 * TOKEN
    world.expect_revert("stake: nothing unbonding", p2.withdraw)


def test_discretionary_slash_only_by_federator(world: World) -> None:
    # Validators slash only through hard_invalidate (a work item, `slash_penalty`).
    for who in (world.stranger, world.p2, world.validator, world.manager):
        world.expect_revert(
            "roles: not federator", lambda w=who: w.slash(world.p1.address, TOKEN), check_funds=True
        )
    world.expect_revert(
        "stake: not a provider", lambda: world.fed.slash(world.stranger.address, TOKEN)
    )
    world.fed.slash(world.p1.address, 40 * TOKEN)
    assert world.fed.provider(world.p1.address).stake == 260 * TOKEN
    assert world.fed.totals()["slashed"] == 40 * TOKEN


def test_slash_takes_stake_then_unbonding_and_caps(world: World) -> None:
    world.p2.remove_node(world.n3.address)
    world.p2.request_unstake(150 * TOKEN)  # stake 50, unbonding 150
    r = world.fed.slash(world.p2.address, 120 * TOKEN)
    assert r.event("Slashed").args["amount"] == 120 * TOKEN
    info = world.fed.provider(world.p2.address)
    assert (info.stake, info.unbonding) == (0, 80 * TOKEN)
    r = world.fed.slash(world.p2.address, 10**30)
    assert r.event("Slashed").args["amount"] == 80 * TOKEN
    assert world.fed.totals()["slashed"] == 200 * TOKEN


def test_collect_slashed_only_by_federator(world: World) -> None:
    world.fed.slash(world.p1.address, 30 * TOKEN)
    world.expect_revert(
        "roles: not federator", lambda: world.stranger.collect_slashed(world.stranger.address)
    )
    before = world.fed.balance(world.manager.address)
    world.fed.collect_slashed(world.manager.address)
    assert world.fed.balance(world.manager.address) == before + 30 * TOKEN
    assert world.fed.totals()["slashed"] == 0


def test_params_and_roles_only_by_federator(world: World) -> None:
    s = world.stranger
    world.expect_revert("roles: not federator", lambda: s.set_stake_params(1, 1, 1))
    world.expect_revert("roles: not federator", lambda: s.set_work_params(1, 1, 1))
    world.expect_revert("roles: not federator", lambda: s.set_validator(s.address, True))
    world.expect_revert("roles: not federator", lambda: s.propose_federator(s.address))
    world.fed.set_stake_params(1, 2, 3600)
    assert world.fed.contract.functions.unbonding_delay().call() == 3600
    world.fed.propose_federator(s.address)
    assert world.fed.federator() == world.fed.address  # nothing moves before the acceptance
    s.accept_federator()
    assert world.fed.federator() == s.address
    world.expect_revert("roles: not federator", lambda: world.fed.set_validator(s.address, True))
    s.set_validator(s.address, True)
    assert world.fed.is_validator(s.address)
