"""`GET /join`: the manifest a stranger joins by, read unsigned from a real orchestrator over a
real anvil; and the checks a worker makes of it through its own RPC before staking (chain id,
code hashes, that the code is meshrl's own contracts, the token's minter record, the pool
manager's signature)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from eth_utils import keccak

from meshrl.pool import JoinManifest, PoolRules
from meshrl.protocol import deploy
from meshrl.protocol.signing import sign_digest
from meshrl.protocol.verify import ContractMismatch, check_contracts
from meshrl.worker.join import PoolNotConfirmed, confirm_pool

from .net import PARAMS

pytestmark = pytest.mark.anvil


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_join_manifest_names_everything_a_stranger_needs(pool) -> None:
    t0 = time.time()
    m = JoinManifest.model_validate(_get(pool.orch.url + "/join"))
    chain, dep = pool.chain, pool.chain.fed.deployment
    assert (m.pool_id, m.chain_id) == (chain.pool, 31337)
    assert (m.token, m.protocol, m.deployment_block) == (dep.token, dep.protocol, dep.block)
    eth = chain.fed.backend.w3.eth
    assert m.code_hashes == {n: "0x" + keccak(bytes(eth.get_code(a))).hex()
                             for n, a in (("token", dep.token), ("protocol", dep.protocol))}
    rules = PoolRules.model_validate(_get(pool.orch.url + "/rules"))
    assert m.rules == rules and m.rules_digest == rules.digest()
    # no public RPC configured (join.rpc_url): none published, never the orchestrator's own
    assert m.rpc_url == "" and m.discovery_url == pool.disc.url
    assert (m.min_stake, m.stake_per_unit) == (PARAMS.min_stake, PARAMS.stake_per_unit)
    assert m.reward_rate == chain.fed.pool(chain.pool).reward_rate == 10**15
    assert m.trainer == chain.accounts["trainer"].address
    assert (m.heartbeat_interval_s, m.dead_after, m.signature_window_s) == (1.0, 3, 300)
    assert t0 - 1 <= m.server_time <= time.time() + 1
    check_contracts(chain.fed.backend, m.chain_id, {"token": m.token, "protocol": m.protocol},
                    m.code_hashes)  # what a worker checks: passes
    assert m.signer == chain.accounts["mgr"].address  # signed by the pool's manager
    confirmed = confirm_pool(chain.fed.backend, m)  # the worker's checks, its own RPC: pass
    assert (confirmed.min_stake, confirmed.reward_rate) == (m.min_stake, m.reward_rate)


def test_a_manifest_not_confirmed_by_the_chain_is_refused(pool) -> None:
    """What `meshrl worker join` refuses, read through the contributor's own RPC."""
    m = JoinManifest.model_validate(_get(pool.orch.url + "/join"))
    backend, thief = pool.chain.fed.backend, pool.chain.accounts["stranger"]

    def refused(m2: JoinManifest, **pins) -> str:
        with pytest.raises(PoolNotConfirmed) as e:
            confirm_pool(backend, m2, **pins)
        return e.value.what

    # any field changed after the manager signed (here: where to announce)
    assert refused(m.model_copy(update={"discovery_url": "http://thief:1"})) == "signature"
    # a manifest the thief signed itself: not the pool's manager
    forged = m.model_copy(update={"signer": thief.address})
    forged = forged.model_copy(update={
        "signature": "0x" + sign_digest(thief.key, forged.digest()).hex()})
    assert refused(forged) == "signature"
    assert refused(m.model_copy(update={"signature": ""})) == "signature"
    assert refused(m.model_copy(update={"signer": "", "signature": ""})) == "signature"
    assert refused(m.model_copy(update={"token": "0x1234"})) == "token"  # not an address
    # meshrl's own protocol, deployed by the thief on this chain for the real token: the code
    # checks pass, the token's own record does not make it a minter
    rogue = deploy(backend, thief, PARAMS, token=m.token)
    code = bytes(backend.w3.eth.get_code(rogue.protocol))
    rogue_m = m.model_copy(update={"protocol": rogue.protocol, "code_hashes": {
        **m.code_hashes, "protocol": "0x" + keccak(code).hex()}})
    assert refused(rogue_m) == "minter"
    # the contributor's pins
    assert refused(m, pin_protocol=rogue.protocol) == "pin"
    assert refused(m, pin=rogue) == "pin"
    confirm_pool(backend, m, pin=pool.chain.fed.deployment,
                 pin_protocol=pool.chain.fed.deployment.protocol)


def test_contract_checks_refuse_another_chain_or_other_code(pool) -> None:
    m = JoinManifest.model_validate(_get(pool.orch.url + "/join"))
    backend = pool.chain.fed.backend
    addrs = {"token": m.token, "protocol": m.protocol}
    with pytest.raises(ContractMismatch) as e:
        check_contracts(backend, 84532, addrs, m.code_hashes)
    assert e.value.what == "chain_id"
    with pytest.raises(ContractMismatch) as e:
        check_contracts(backend, m.chain_id, addrs, {**m.code_hashes, "token": "0x" + "00" * 32})
    assert e.value.what == "token"
    # an account with no code (a pool naming an EOA as its token), hashed honestly
    eoa = pool.chain.accounts["stranger"].address
    with pytest.raises(ContractMismatch) as e:
        check_contracts(backend, m.chain_id, {**addrs, "protocol": eoa},
                        {**m.code_hashes, "protocol": "0x" + keccak(b"").hex()})
    assert e.value.what == "protocol"
    # other code that the manifest hashes honestly: the token deployed where the protocol
    # should be is not meshrl's protocol
    other = deploy(backend, pool.chain.accounts["stranger"], PARAMS)
    code = bytes(backend.w3.eth.get_code(other.token))
    with pytest.raises(ContractMismatch) as e:
        check_contracts(backend, m.chain_id, {**addrs, "protocol": other.token},
                        {**m.code_hashes, "protocol": "0x" + keccak(code).hex()})
    assert e.value.what == "protocol" and "not meshrl's protocol" in str(e.value)
