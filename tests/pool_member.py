"""One provider with its node in a started pool of a fresh deployment: the set-up the claim
tests share (worker claims, `chain claim` batches, a draining pool). A module of its own
beside conftest.py (tests/ is on sys.path), so every test package imports the same one."""

from __future__ import annotations

from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount

from meshrl.protocol import Backend, Deployment, Protocol, ProtocolParams, deploy
from meshrl.protocol.signing import sign_invite

__all__ = ["TOKEN", "Member", "member_in_pool"]

TOKEN = 10**18


@dataclass
class Member:
    provider: Protocol  # the provider's client
    pool: int
    node: LocalAccount
    account: LocalAccount  # the provider's key
    deployment: Deployment


def member_in_pool(backend: Backend, lock: int, rate: int) -> Member:
    """A deployment whose windows, lock and unbonding are `lock` seconds, a pool paying `rate`
    a unit, and a provider staked 20 tokens with one node joined to it."""
    fed, mgr, prov, node = (Account.create() for _ in range(4))
    for a in (fed, mgr, prov, node):
        backend.fund(a.address, 10**21)
    dep = deploy(backend, fed, ProtocolParams(min_stake=10 * TOKEN, stake_per_unit=TOKEN,
                                              invalidation_window=lock, lock_period=lock,
                                              unbonding_delay=lock))
    chain = Protocol(backend, dep, fed)
    pool = chain.create_pool(chain.create_domain("d"), mgr.address, rate)
    chain.start_pool(pool)
    chain.mint(prov.address, 100 * TOKEN)
    p = chain.as_(prov)
    p.register_provider(20 * TOKEN)
    p.add_node(node, 1)
    expiry = backend.now() + 3600
    sig = sign_invite(mgr.key, dep.protocol, backend.chain_id, chain.pool(pool).domain, pool,
                      node.address, chain.node_generation(node.address), 1, expiry)
    chain.as_(node).join_pool(pool, node.address, 1, expiry, sig)
    return Member(p, pool, node, prov, dep)
