"""Pool rules: federator creates, lifecycle, one-time signed invites, leave/eject/blacklist."""

from __future__ import annotations

from meshrl.protocol import PoolStatus, invite_digest, sign_invite

from .helpers import RATE, World


def test_create_only_by_federator(world: World) -> None:
    s = world.stranger
    world.expect_revert("roles: not federator", lambda: s.create_domain("x"))
    world.expect_revert("roles: not federator", lambda: s.create_pool(1, s.address, 1))
    world.expect_revert("roles: not federator", lambda: s.set_reward_rate(world.pool, 1))
    world.expect_revert("pools: unknown domain", lambda: world.fed.create_pool(99, s.address, 1))
    world.expect_revert("pools: empty name", lambda: world.fed.create_domain(""))
    d = world.fed.create_domain("code")
    pool = world.fed.create_pool(d, s.address, 7)
    info = world.fed.pool(pool)
    assert (info.domain, info.manager, info.status, info.reward_rate) == (
        d,
        s.address,
        PoolStatus.PENDING,
        7,
    )


def test_find_domain_by_name(world: World) -> None:
    assert world.fed.find_domain("math") == world.domain
    assert world.fed.find_domain("nope") is None


def test_lifecycle(world: World) -> None:
    pid = world.pending_pool
    world.expect_revert("pools: not pool admin", lambda: world.stranger.start_pool(pid))
    world.expect_revert("pools: not active", lambda: world.manager.complete_pool(pid))
    world.expect_revert("pools: unknown pool", lambda: world.fed.start_pool(99))
    world.manager.start_pool(pid)
    assert world.fed.pool(pid).status == PoolStatus.ACTIVE
    world.expect_revert("pools: not pending", lambda: world.fed.start_pool(pid))
    world.fed.complete_pool(pid)
    assert world.fed.pool(pid).status == PoolStatus.COMPLETED
    world.expect_revert("pools: not active", lambda: world.fed.complete_pool(pid))


def test_invite_digest_matches_contract(world: World) -> None:
    n1 = world.n1.address
    world.manager.eject_node(world.pool, n1)  # generation 1: the digest must follow it
    args = (world.domain, world.pool, n1, 7, 12345)
    onchain = world.fed.contract.functions.invite_digest(*args).call()
    offchain = invite_digest(
        world.fed.contract.address,
        world.backend.chain_id,
        world.domain,
        world.pool,
        n1,
        1,
        7,
        12345,
    )
    assert onchain == offchain


def test_join_with_invite_by_provider_or_node(world: World) -> None:
    r = world.p2.join_pool(*world.invite(world.pool, world.n3.address, nonce=5))
    assert r.event("NodeJoined").args["nonce"] == 5
    assert world.fed.node(world.n3.address).pool == world.pool
    assert world.fed.pool(world.pool).node_count == 2
    world.p2.leave_pool(world.n3.address)
    world.client(world.n3).join_pool(*world.invite(world.pool, world.n3.address, nonce=6))
    assert world.fed.node(world.n3.address).pool == world.pool


def test_join_refused_without_valid_invite(world: World) -> None:
    p2, n3, pool = world.p2, world.n3.address, world.pool
    now = world.backend.now()
    world.expect_revert(
        "pools: invite expired",
        lambda: p2.join_pool(*world.invite(pool, n3, expiry=now - 1)),
        check_funds=True,
    )
    forged = sign_invite(
        world.stranger.account.key,
        world.fed.contract.address,
        world.backend.chain_id,
        world.domain,
        pool,
        n3,
        0,
        1,
        now + 600,
    )
    world.expect_revert(
        "pools: bad invite signature",
        lambda: p2.join_pool(pool, n3, 1, now + 600, forged),
        check_funds=True,
    )
    _, _, nonce, expiry, sig = world.invite(pool, world.n2.address)  # for another node
    world.expect_revert(
        "pools: bad invite signature", lambda: p2.join_pool(pool, n3, nonce, expiry, sig)
    )
    _, _, nonce, expiry, sig = world.invite(pool, n3, nonce=1)
    world.expect_revert(
        "pools: bad invite signature",  # tampered nonce / expiry
        lambda: p2.join_pool(pool, n3, nonce + 1, expiry, sig),
    )
    world.expect_revert(
        "pools: bad invite signature", lambda: p2.join_pool(pool, n3, nonce, expiry + 1, sig)
    )
    world.expect_revert(
        "pools: not active", lambda: p2.join_pool(*world.invite(world.pending_pool, n3))
    )
    world.expect_revert(
        "nodes: not node or provider", lambda: world.p1.join_pool(*world.invite(pool, n3))
    )
    world.expect_revert(
        "pools: unknown node", lambda: p2.join_pool(*world.invite(pool, world.n2.address))
    )
    assert world.fed.node(n3).pool == 0


def test_invite_is_single_use(world: World) -> None:
    invite = world.invite(world.pool, world.n3.address, nonce=9)
    world.p2.join_pool(*invite)
    world.expect_revert("pools: node already in a pool", lambda: world.p2.join_pool(*invite))
    world.p2.leave_pool(world.n3.address)
    world.expect_revert("pools: invite used", lambda: world.p2.join_pool(*invite), check_funds=True)
    world.p2.join_pool(*world.invite(world.pool, world.n3.address, nonce=10))


def test_leave_eject_blacklist(world: World) -> None:
    pool, n1 = world.pool, world.n1.address
    world.expect_revert("nodes: not node or provider", lambda: world.p2.leave_pool(n1))
    world.expect_revert("pools: node not in a pool", lambda: world.p2.leave_pool(world.n3.address))
    world.expect_revert("pools: not pool admin", lambda: world.stranger.eject_node(pool, n1))
    world.expect_revert("pools: not pool admin", lambda: world.p1.blacklist_node(pool, n1))
    world.expect_revert(
        "pools: node not in pool", lambda: world.manager.eject_node(pool, world.n3.address)
    )
    world.manager.eject_node(pool, n1)
    assert world.fed.node(n1).pool == 0 and world.fed.pool(pool).node_count == 0
    world.p1.join_pool(*world.invite(pool, n1, nonce=2))
    r = world.manager.blacklist_node(pool, n1)
    assert [e.name for e in r.events] == ["NodeEjected", "NodeBlacklisted"]
    assert world.fed.is_blacklisted(pool, n1) and world.fed.node(n1).pool == 0
    world.expect_revert(
        "pools: node blacklisted", lambda: world.p1.join_pool(*world.invite(pool, n1, nonce=3))
    )


def test_completed_pool_refuses_joins(world: World) -> None:
    world.fed.complete_pool(world.pool)
    world.expect_revert(
        "pools: not active", lambda: world.p2.join_pool(*world.invite(world.pool, world.n3.address))
    )
    world.p1.leave_pool(world.n1.address)  # leaving still works
    assert world.fed.pool(world.pool).reward_rate == RATE
