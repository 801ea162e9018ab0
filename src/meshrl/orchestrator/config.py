"""Typed configuration of `meshrl orchestrator` (TOML + dotted overrides)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.pool import RulesSpec
from meshrl.protocol.config import ChainConfig, hex_address
from meshrl.wire.guard import GuardConfig

__all__ = [
    "DiskStoreConfig",
    "HeartbeatConfig",
    "JoinConfig",
    "OnboardingConfig",
    "OrchestratorConfig",
    "Requirements",
    "WorkConfig",
]


class DiskStoreConfig(Config):
    """The built-in file store: rollout files on the orchestrator's own disk."""

    type: Literal["disk"] = "disk"
    root: str = Field("runs/orchestrator/files", description="directory of stored files")
    fsync: bool = Field(True, description="fsync each file before acknowledging its upload")


class Requirements(Config):
    """What a node's announced hardware must have to be invited."""

    min_cores: int = Field(1, ge=1, description="CPU cores")
    min_memory_gb: float = Field(0.0, ge=0, description="host memory")
    min_accelerators: int = Field(0, ge=0, description="accelerators (GPUs) in total")
    min_accelerator_memory_gb: float = Field(0.0, ge=0, description="memory per accelerator")


class OnboardingConfig(Config):
    discovery_url: str = Field("", description="discovery service (empty: no onboarding)")
    poll_s: float = Field(5.0, gt=0, description="seconds between discovery reads")
    invite_ttl_s: int = Field(600, ge=10, description="seconds an invite stays valid")
    recheck_s: float = Field(30.0, ge=0, description="seconds before a refused candidate is "
                             "checked again")
    requirements: Requirements = Requirements()


class HeartbeatConfig(Config):
    interval_s: float = Field(10.0, gt=0, description="seconds between a node's heartbeats")
    dead_after: int = Field(3, ge=1, description="missed heartbeats before ejection")
    slack: float = Field(0.5, ge=0, le=1, description="fraction of an interval a heartbeat "
                         "may be late before it counts as missed")
    eject: bool = Field(True, description="eject dead nodes on chain")


class WorkConfig(Config):
    """How the orchestrator hands out work (the rules themselves are `[rules]`)."""

    step: int = Field(0, ge=0, description="the pool's current training step")
    shardcast_servers: list[str] = Field(default_factory=list, description="policy sources")
    max_file_bytes: int = Field(64 << 20, ge=1, description="largest rollout file accepted")
    max_units_per_file: int = Field(1 << 20, ge=1, description="most work units per file "
                                    "(the pool's on-chain maximum, if lower, wins)")
    slot_ttl_s: float = Field(600.0, gt=0, description="seconds an upload slot stays valid")
    stall_log_s: float = Field(20.0, gt=0, description="while the pool's step does not move, "
                               "log this often what it has (members, files of the step by "
                               "status) and why it may not fill: no silent stall")
    lease_s: float = Field(30.0, gt=0, description="pacing: how long a work order's want of "
                           "one file holds that file's place for its node (until its next work "
                           "order at the latest)")
    max_hold_s: float = Field(5.0, ge=0, le=30, description="the longest a `wait=` request "
                              "(`GET /work`, `GET /ledger`) is held for an answer that is not "
                              "empty (0: every request is answered at once)")
    max_held_per_signer: int = Field(4, ge=1, description="`wait=` requests one address may "
                                     "have held at once (more: 429 too_many_held)")
    max_held_per_ip: int = Field(64, ge=1, description="`wait=` requests one source IP may "
                                 "have held at once (more: 429 too_many_held)")
    submit_s: float = Field(300.0, gt=0, description="seconds after its upload a file must be "
                            "submitted on chain: later it no longer counts in flight for "
                            "pacing, and its node is granted no slot and wanted no file until "
                            "it submits it (or unsubmitted_penalty_s pass)")
    unsubmitted_penalty_s: float = Field(600.0, ge=0, description="how long past its "
                                         "submission deadline an unsubmitted upload keeps its "
                                         "node from new slots and work")
    turnaround_orders: bool = Field(False, description="pacing: measure each node's lag (the "
                                    "pool's steps from a work order to the trainer taking its "
                                    "file) and want a file from it only when its version will "
                                    "still be taken by then (docs/joining.md, remote members; "
                                    "`meshrl network up` turns it on in a public pool)")
    turnaround_window_s: float = Field(120.0, gt=0, description="pacing: how long a measured "
                                       "lag counts; a node refused for its lag is measured "
                                       "again once its lags are this old")


class JoinConfig(Config):
    """What `GET /join` advertises to strangers (each empty one: this orchestrator's own)."""

    rpc_url: str = Field("", description="a public JSON-RPC of the chain, published as a hint "
                         "without user, password, query or fragment (empty: none is published; "
                         "chain.rpc_url never is; a pool on anvil publishes its RPC filter)")
    discovery_url: str = Field("", description="discovery as strangers reach it (empty: "
                               "onboarding.discovery_url)")
    trainer: str = Field("", description="the trainer's address (empty: the first reader)")
    cache_s: float = Field(30.0, ge=0, description="seconds the chain's part is kept")

    _trainer = field_validator("trainer", mode="before")(hex_address)


class OrchestratorConfig(Config):
    """One orchestrator per compute pool; its chain key is the pool's manager key."""

    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(8600, ge=0, lt=65536, description="listen port (0: any free port)")
    pool_id: int = Field(1, ge=1, description="the compute pool this orchestrator manages")
    db: str = Field("runs/orchestrator/state.db", description="SQLite state (WAL)")
    ready_file: str = Field("", description="write {url} here once listening (tests, scripts)")
    readers: list[str] = Field(default_factory=list,
                               description="addresses that may read the ledger and files (trainer)")
    chain_poll_s: float = Field(2.0, gt=0, description="seconds between chain event polls")
    validator_cache_s: float = Field(30.0, ge=0, description="seconds a validator check is kept")
    blacklist_fraud: bool = Field(True, description="blacklist in this pool every node whose "
                                  "work was hard-invalidated (ejection alone would let it be "
                                  "invited again once its provider restakes)")
    chain: ChainConfig = ChainConfig()
    guard: GuardConfig = GuardConfig()
    store: DiskStoreConfig = DiskStoreConfig()
    heartbeat: HeartbeatConfig = HeartbeatConfig()
    onboarding: OnboardingConfig = OnboardingConfig()
    work: WorkConfig = WorkConfig()
    join: JoinConfig = JoinConfig()
    rules: RulesSpec = Field(default_factory=RulesSpec, description="the pool's public rules, "
                             "published at GET /rules and in every work order (proof_profile "
                             "meshrl-cpu-engine only when every worker runs meshrl's CPU engine)")

    _readers = field_validator("readers", mode="before")(hex_address)
