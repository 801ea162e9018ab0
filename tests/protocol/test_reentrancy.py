"""Re-entrancy on withdraw and claim, with a token that calls back into the protocol while it is
being paid (it is the protocol's token *and* a provider). The re-entered call is one that would
succeed on its own, so only the protocol's non-reentrancy lock can stop it."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrl.protocol import EthTesterBackend, Protocol, deploy
from meshrl.protocol.artifacts import compile_contract
from meshrl.protocol.signing import sign_invite, sign_ownership, work_id

from .helpers import PARAMS, TOKEN, file_hash, key

EVIL = Path(__file__).parent / "contracts" / "evil_token.vy"
NODE = key("r-node")


def _wid(label: str) -> bytes:
    return work_id(NODE.address, file_hash(label))


@pytest.fixture(scope="module")
def prepared():
    backend = EthTesterBackend()
    fed, mgr, node = key("r-fed"), key("r-mgr"), NODE
    for a in (fed, mgr, node):
        backend.fund(a.address, 10**21)
    art = compile_contract(EVIL)
    factory = backend.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    addr = backend.send(fed, {"data": factory.constructor().data_in_transaction})["contractAddress"]
    evil = backend.w3.eth.contract(address=addr, abi=art.abi)
    dep = deploy(backend, fed, PARAMS, token=addr)
    P = Protocol(backend, dep, fed)
    f = P.contract.functions
    chain_id = backend.chain_id

    def act(fn):  # the evil token acts as a provider
        backend.send(
            fed,
            {
                "to": addr,
                "data": evil.functions.execute(
                    P.contract.address, fn._encode_transaction_data()
                )._encode_transaction_data(),
            },
        )

    backend.send(
        fed,
        {"to": addr, "data": evil.functions.mint(addr, 10**6 * TOKEN)._encode_transaction_data()},
    )
    backend.send(
        fed,
        {
            "to": addr,
            "data": evil.functions.execute(
                addr,
                evil.functions.approve(P.contract.address, 2**256 - 1)._encode_transaction_data(),
            )._encode_transaction_data(),
        },
    )
    act(f.register_provider(1000 * TOKEN))
    act(
        f.add_node(node.address, 1, sign_ownership(node.key, P.contract.address, chain_id, addr, 0))
    )
    domain = P.create_domain("d")
    pool = P.create_pool(domain, mgr.address, TOKEN)
    P.start_pool(pool)
    expiry = backend.now() + 3600
    P.as_(node).join_pool(
        pool,
        node.address,
        1,
        expiry,
        sign_invite(
            mgr.key, P.contract.address, chain_id, domain, pool, node.address, 0, 1, expiry
        ),
    )
    for label in ("a", "b", "c"):
        act(f.submit_work(pool, node.address, file_hash(label), 10))
    act(f.request_unstake(500 * TOKEN))
    backend.advance_time(PARAMS.unbonding_delay + 1)
    return backend, P, evil, act


@pytest.fixture
def setup(prepared):
    snap = prepared[0].snapshot()
    yield prepared
    prepared[0].revert(snap)


def _arm(backend, P, evil, payload_fn) -> None:
    payload = payload_fn._encode_transaction_data()
    backend.send(
        P.account,
        {
            "to": evil.address,
            "data": evil.functions.arm(P.contract.address, payload)._encode_transaction_data(),
        },
    )


def test_reentering_withdraw_is_stopped(setup) -> None:
    backend, P, evil, act = setup
    f = P.contract.functions
    held = evil.functions.balanceOf(P.contract.address).call()
    _arm(backend, P, evil, f.claim([_wid("a")]))  # a valid claim on its own
    act(f.withdraw())
    assert evil.functions.reentered().call()
    assert not evil.functions.reentry_ok().call()
    assert evil.functions.reentry_data().call() == b""  # the bare revert of the lock
    assert evil.functions.balanceOf(P.contract.address).call() == held - 500 * TOKEN
    assert P.work(_wid("a")).status == 1  # the re-entered claim did not happen


def test_reentering_claim_is_stopped(setup) -> None:
    backend, P, evil, act = setup
    f = P.contract.functions
    _arm(backend, P, evil, f.claim([_wid("b")]))
    act(f.claim([_wid("a")]))
    assert evil.functions.reentered().call() and not evil.functions.reentry_ok().call()
    assert evil.functions.reentry_data().call() == b""
    assert P.totals()["claimed"] == 10 * TOKEN  # one claim, not two
    assert P.work(_wid("b")).status == 1
    # the same claim outside the callback works: the lock, not the claim, stopped it
    act(f.claim([_wid("b")]))
    assert P.totals()["claimed"] == 20 * TOKEN


def test_unarmed_token_pays_normally(setup) -> None:
    _backend, P, evil, act = setup
    held = evil.functions.balanceOf(P.contract.address).call()
    act(P.contract.functions.withdraw())
    assert not evil.functions.reentered().call()
    assert evil.functions.balanceOf(P.contract.address).call() == held - 500 * TOKEN
