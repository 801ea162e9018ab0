"""The typed Python client of the protocol contracts: deploy the set, act as any role, read
state and events. Every transaction is signed locally; every revert raises `TxReverted`.

`Protocol` is composed of facets, one per Vyper module (`meshrl.protocol.facets`: token,
treasury, roles, stake, nodes, pools, work, batches); this module deploys the set and builds
the client."""

from __future__ import annotations

from typing import Any

from eth_account.signers.local import LocalAccount

from meshrl.protocol.artifacts import load_artifact
from meshrl.protocol.backend import Backend
from meshrl.protocol.config import ProtocolParams
from meshrl.protocol.events import EventDecoder
from meshrl.protocol.facets.batches import BatchesFacet
from meshrl.protocol.facets.nodes import NodesFacet
from meshrl.protocol.facets.pools import DEFAULT_MAX_UNITS, PoolsFacet
from meshrl.protocol.facets.roles import RolesFacet
from meshrl.protocol.facets.stake import StakeFacet
from meshrl.protocol.facets.token import TokenFacet
from meshrl.protocol.facets.treasury import TreasuryFacet
from meshrl.protocol.facets.work import SETTLE_GAS, WorkFacet
from meshrl.protocol.records import Deployment

__all__ = ["DEFAULT_MAX_UNITS", "SETTLE_GAS", "Protocol", "deploy", "protocol_abi"]


def _deploy_one(backend: Backend, account: LocalAccount, name: str, *args: Any) -> Any:
    art = load_artifact(name)
    factory = backend.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    receipt = backend.send(account, {"data": factory.constructor(*args).data_in_transaction})
    return receipt["contractAddress"], receipt["blockNumber"]


def deploy(
    backend: Backend,
    federator: LocalAccount,
    params: ProtocolParams | None = None,
    token: str | None = None,
) -> Deployment:
    """Deploy token + protocol with `federator` as admin. The new token's minting right and
    ownership go to the protocol (the federator keeps none of its own: it acts through the
    protocol, so handing over the federator role hands over the token too).

    With `token`, use that existing ERC-20 instead (it must let the protocol mint rewards).
    """
    p = params or ProtocolParams()
    own_token = token is None
    if token is None:
        token, block = _deploy_one(backend, federator, "token", p.token_name, p.token_symbol)
    else:
        block = backend.block_number()
    extension, _ = _deploy_one(backend, federator, "batches")
    protocol, _ = _deploy_one(
        backend,
        federator,
        "protocol",
        extension,
        token,
        p.min_stake,
        p.stake_per_unit,
        p.unbonding_delay,
        p.invalidation_window,
        p.lock_period,
        p.slash_penalty,
        p.verdict_bond,
        p.dispute_period,
        p.vote_period,
        p.quorum,
    )
    dep = Deployment(backend.chain_id, token, protocol, federator.address, block)
    if own_token:
        c = Protocol(backend, dep, federator)
        t = c.token.functions
        c._send(t.set_minter(protocol, True))
        c._send(t.set_minter(federator.address, False))
        c._send(t.transfer_ownership(protocol))
    return dep


def protocol_abi() -> list[dict[str, Any]]:
    """The protocol's ABI with its extension's functions and events (`batches.vy`: run by the
    protocol's fallback on its storage, so called and logged at the protocol's address)."""
    ext = [e for e in load_artifact("batches").abi if e["type"] in ("function", "event")]
    return [e for e in load_artifact("protocol").abi if e["type"] != "fallback"] + ext


class Protocol(
    TokenFacet,
    TreasuryFacet,
    RolesFacet,
    StakeFacet,
    NodesFacet,
    PoolsFacet,
    WorkFacet,
    BatchesFacet,
):
    """All protocol actions, signed by `account`. `as_(other)` acts as another account."""

    def __init__(
        self, backend: Backend, deployment: Deployment, account: LocalAccount | None = None
    ):
        if deployment.chain_id != backend.chain_id:
            raise ValueError(
                f"deployment is for chain {deployment.chain_id}, "
                f"backend is chain {backend.chain_id}"
            )
        self.backend = backend
        self.deployment = deployment
        self.account = account
        w3 = backend.w3
        self.token = w3.eth.contract(address=deployment.token, abi=load_artifact("token").abi)
        self.contract = w3.eth.contract(address=deployment.protocol, abi=protocol_abi())
        self.decoder = EventDecoder(backend, [self.token, self.contract])

    def as_(self, account: LocalAccount) -> Protocol:
        other = Protocol.__new__(Protocol)
        other.__dict__.update(self.__dict__)
        other.account = account
        return other
