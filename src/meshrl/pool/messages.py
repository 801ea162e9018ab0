"""Messages that carry the pool's rules over the wire (built from `meshrl.wire.models.Model`)."""

from __future__ import annotations

import json

from eth_utils import keccak
from pydantic import Field

from meshrl.pool.rules import PoolRules
from meshrl.wire.models import I64, MAX_HOLD_S, Model

__all__ = ["JoinManifest", "WorkOrder", "WorkQuery"]


class WorkQuery(Model):
    """`GET /work?version=V&wait=S`: the policy version the node holds now (fresher than its
    last heartbeat's), and how long the orchestrator may hold the request while the pool
    wants no file from it (hold.py; 0: answer at once)."""

    version: int | None = Field(None, ge=-1, le=I64, description="the policy version held")
    wait: float = Field(0.0, ge=0, le=MAX_HOLD_S, allow_inf_nan=False,
                        description="seconds the answer may wait for a file to be wanted")


class WorkOrder(Model):
    """What a node generates now: the pool's rules, its step, the policy versions a node may
    generate with and where to fetch them."""

    rules: PoolRules
    step: int = Field(ge=0)
    policy_versions: list[int] = Field(max_length=1025, description="versions a node may "
                                       "generate with")
    shardcast_servers: list[str] = Field(max_length=64)
    max_file_bytes: int = Field(ge=1)
    max_units_per_file: int = Field(ge=1)
    files_wanted: int | None = Field(None, ge=0, le=1 << 20, description="files the pool "
                                     "wants from this node now (the trainer's pacing: 0, wait "
                                     "and ask again; None: as many as its counters allow)")
    waiting: str = Field("", max_length=1000, description="why the pool wants no file now "
                         "(empty when it does)")


class JoinManifest(Model):
    """`GET /join` (unsigned request, signed answer): everything a stranger needs to join the
    pool from anywhere, with nothing but the orchestrator's URL. Nothing in it is trusted as
    served: a worker confirms the chain facts through its own RPC (the code at both addresses,
    the token's minter record, the pool's manager) and the manager's `signature` over
    `digest()` before it stakes anything (docs/joining.md)."""

    pool_id: int = Field(ge=1)
    domain_id: int = Field(ge=0)
    chain_id: int = Field(ge=1)
    rpc_url: str = Field(max_length=2048, description="a public JSON-RPC of the chain, a hint "
                         "only (empty when the operator published none); a worker reads the "
                         "chain through its own")
    token: str = Field(max_length=42, description="the stake / reward token (ERC-20)")
    protocol: str = Field(max_length=42, description="the protocol contract")
    deployment_block: int = Field(ge=0, description="the block the contracts were deployed in")
    code_hashes: dict[str, str] = Field(max_length=8, description="keccak256 (0x-hex) of the "
                                        "runtime code of `token` and `protocol` on chain")
    rules: PoolRules
    rules_digest: str = Field(max_length=64, description="sha256 of the rules' canonical JSON")
    discovery_url: str = Field(max_length=2048)
    shardcast_servers: list[str] = Field(max_length=64)
    min_stake: int = Field(ge=0, description="token base units a provider registers with")
    stake_per_unit: int = Field(ge=0, description="token base units of stake per compute unit")
    reward_rate: int = Field(ge=0, description="token base units per work unit")
    max_units_per_file: int = Field(ge=1)
    trainer: str = Field(max_length=42, description="the address that signs policy versions "
                         "(and reads the ledger)")
    heartbeat_interval_s: float = Field(gt=0)
    dead_after: int = Field(ge=1, description="missed heartbeats before a node is ejected")
    signature_window_s: int = Field(ge=1, description="how far a signed request's timestamp "
                                    "may be from the orchestrator's clock")
    server_time: float = Field(description="the orchestrator's clock (unix seconds) when it "
                               "answered: a node whose clock is further off than the window "
                               "is refused on every signed request")
    signer: str = Field("", max_length=42, description="the pool manager's address, whose "
                        "key signed the manifest (a worker checks it is the pool's manager on "
                        "chain)")
    signature: str = Field("", max_length=132, description="0x-hex EIP-191 signature of "
                           "`digest()` by `signer` (empty: unsigned, refused by workers)")

    def digest(self) -> bytes:
        """What the manager signs: keccak256 of a domain tag and the canonical JSON of every
        field but `signature` and `server_time` (the clock is only a hint: a wrong one makes
        signed requests fail, it moves no funds), so one signature serves a cache period. The
        rules enter by their own digest, which stays the same across versions that add rule
        fields with defaults."""
        data = self.model_dump(mode="json", exclude={"signature", "server_time"})
        data["rules"] = self.rules.digest()
        body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return keccak(b"meshrl join manifest\x00" + body)
