"""Test helpers: deterministic accounts, the deployed base world and revert checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from meshrl.protocol import Backend, Protocol, ProtocolParams, TxReverted, deploy
from meshrl.protocol.errors import REVERTS

TOKEN = 10**18
PARAMS = ProtocolParams(
    min_stake=100 * TOKEN,
    stake_per_unit=10 * TOKEN,
    unbonding_delay=7 * 86400,
    invalidation_window=3600,
    lock_period=86400,
    slash_penalty=50 * TOKEN,
    verdict_bond=100 * TOKEN,
    dispute_period=0,  # verdicts final at once here; tests/protocol/test_disputes.py disputes them
)
BOND = 1000 * TOKEN  # the validator's posted bond in the base world
RATE = 10**15  # reward per work unit in pool 1


def key(label: str) -> LocalAccount:
    """A deterministic test account."""
    return Account.from_key(keccak(text=f"meshrl-test-{label}"))


def file_hash(label: str) -> bytes:
    return keccak(text=f"rollout-{label}")


@dataclass
class World:
    """A deployed protocol in its base state and the actors around it."""

    backend: Backend
    fed: Protocol  # the federator's client
    validator: Protocol
    manager: Protocol
    p1: Protocol  # provider with node n1 (5 units) in active pool 1
    p2: Protocol  # provider with node n3 (4 units), in no pool
    stranger: Protocol  # funded account with tokens but no role
    n1: LocalAccount
    n2: LocalAccount  # a node key nobody has added yet
    n3: LocalAccount
    domain: int
    pool: int  # active, rate RATE, manager = manager
    pending_pool: int

    def client(self, account: LocalAccount) -> Protocol:
        return self.fed.as_(account)

    def invite(self, pool: int, node: str, nonce: int = 1, expiry: int | None = None) -> tuple:
        expiry = self.backend.now() + 600 if expiry is None else expiry
        return pool, node, nonce, expiry, self.manager.sign_invite(pool, node, nonce, expiry)

    def funds(self) -> dict[str, int]:
        """Every token balance and protocol total, to check that a failed action moved nothing."""
        who = [self.fed, self.validator, self.manager, self.p1, self.p2, self.stranger]
        out = {c.address: self.fed.balance(c.address) for c in who}
        out["protocol"] = self.fed.balance(self.fed.contract.address)
        out.update({f"total_{k}": v for k, v in self.fed.totals().items()})
        for c in (self.p1, self.p2):
            info = self.fed.provider(c.address)
            out[f"stake_{c.address}"] = (info.stake, info.unbonding)
        return out

    def expect_revert(
        self, reason: str, action: Callable[[], Any], check_funds: bool = False
    ) -> TxReverted:
        """`action` must revert with exactly `reason` (and, if asked, move no funds).

        Preflight is off, so the transaction really goes on chain (a status-0 receipt) rather
        than being stopped by gas estimation: the balance check then means something.
        """
        before = self.funds() if check_funds else None
        self.backend.preflight = False
        try:
            with pytest.raises(TxReverted) as info:
                action()
        finally:
            self.backend.preflight = True
        assert info.value.reason == reason
        assert type(info.value) is REVERTS.get(reason, TxReverted)  # its class, by reason
        assert info.value.tx_hash is not None  # it was mined and reverted on chain
        if check_funds:
            assert self.funds() == before
        return info.value


def build_world(backend: Backend, params: ProtocolParams = PARAMS) -> World:
    fed, val, mgr, a1, a2, s = (key(x) for x in ("fed", "val", "mgr", "p1", "p2", "stranger"))
    n1, n2, n3 = key("n1"), key("n2"), key("n3")
    for acct in (fed, val, mgr, a1, a2, s, n1, n2, n3):
        backend.fund(acct.address, 10**21)
    dep = deploy(backend, fed, params)
    F = Protocol(backend, dep, fed)
    for acct in (a1, a2, s, val):
        F.mint(acct.address, 10_000 * TOKEN)
    F.set_validator(val.address)
    F.as_(val).post_bond(BOND)
    domain = F.create_domain("math")
    pool = F.create_pool(domain, mgr.address, RATE)
    pending = F.create_pool(domain, mgr.address, RATE)
    F.start_pool(pool)
    w = World(
        backend,
        F,
        F.as_(val),
        F.as_(mgr),
        F.as_(a1),
        F.as_(a2),
        F.as_(s),
        n1,
        n2,
        n3,
        domain,
        pool,
        pending,
    )
    w.p1.register_provider(300 * TOKEN)
    w.p1.add_node(n1, 5)
    w.p1.join_pool(*w.invite(pool, n1.address, nonce=1))
    w.p2.register_provider(200 * TOKEN)
    w.p2.add_node(n3, 4)
    return w
