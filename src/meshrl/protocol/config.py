"""Typed configuration of the protocol contracts and of the chain connection."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from meshrl.config import Config
from meshrl.wire.guard import GuardConfig

__all__ = [
    "MAX_CALL_GAS", "NEVER_METHODS", "NEVER_PREFIXES", "STANDARD_METHODS", "ChainConfig",
    "FilterGuardConfig", "ProtocolParams", "RpcFilterConfig", "hex_address", "hex_key",
    "never_forwarded",
]


def hex_key(value: object) -> object:
    """A key typed on the command line arrives as a TOML hex integer: make it text again."""
    return f"0x{value:064x}" if isinstance(value, int) else value


def hex_address(value: object) -> object:
    """A checksummed address; one typed on the command line arrives as a TOML hex integer."""
    if isinstance(value, list):
        return [hex_address(v) for v in value]
    if isinstance(value, int):
        value = f"0x{value:040x}"
    if not isinstance(value, str) or value == "":
        return value
    from eth_utils import is_address, to_checksum_address

    if not is_address(value):
        raise ValueError(f"not an address: {value!r}")
    return to_checksum_address(value)


TOKEN = 10**18
MIN_DISPUTE_PERIOD = 60  # work.vy's floor: the federator may not make verdicts final at once


class ProtocolParams(Config):
    """Constructor arguments of the contracts (amounts in token base units, times in seconds)."""

    token_name: str = Field("Mesh Token", description="ERC-20 name")
    token_symbol: str = Field("MESH", description="ERC-20 symbol")
    min_stake: int = Field(100 * TOKEN, ge=0, description="stake needed to register a provider")
    stake_per_unit: int = Field(10 * TOKEN, ge=0, description="stake required per compute unit")
    unbonding_delay: int = Field(7 * 86400, ge=0, description="seconds before unstaked tokens free")
    invalidation_window: int = Field(3600, ge=0, description="seconds validators may invalidate")
    lock_period: int = Field(86400, ge=0, description="seconds before a reward is claimable")
    slash_penalty: int = Field(50 * TOKEN, ge=0, description="stake slashed on hard invalidation")
    verdict_bond: int = Field(100 * TOKEN, ge=0, description="validator bond locked per open "
                              "verdict, paid to the provider if the verdict is overturned")
    dispute_period: int = Field(3600, ge=0, le=30 * 86400, description="seconds a verdict can "
                                "be challenged before it is final, at least 60 (0, only at "
                                "deployment: verdicts final at once, validators trusted)")
    vote_period: int = Field(3600, ge=0, le=30 * 86400, description="seconds a challenge leaves "
                             "validators at least to vote")
    quorum: int = Field(1, ge=1, description="upholding votes a challenged verdict needs")

    @model_validator(mode="after")
    def _ordered(self) -> ProtocolParams:
        # The contracts refuse these too; say so before a deployment is attempted.
        if self.lock_period < self.invalidation_window:
            raise ValueError("lock_period must be >= invalidation_window")
        if self.unbonding_delay < self.invalidation_window:
            raise ValueError("unbonding_delay must be >= invalidation_window")
        if 0 < self.dispute_period < MIN_DISPUTE_PERIOD:
            raise ValueError(f"dispute_period must be 0 or >= {MIN_DISPUTE_PERIOD}")
        if self.dispute_period > 0 and self.vote_period == 0:
            raise ValueError("vote_period must be > 0 when verdicts can be disputed")
        return self


class ChainConfig(Config):
    """Which chain to talk to and with which key."""

    backend: Literal["eth-tester", "rpc"] = Field("rpc", description="eth-tester or rpc")
    rpc_url: str = Field("http://127.0.0.1:8545", description="JSON-RPC endpoint")
    deployment: str = Field("runs/chain/deployment.json", description="contract addresses file")
    private_key: str = Field("", description="hex key that signs transactions, in a config "
                             "file only (on a command line it shows in `ps`: use key_file)")
    key_file: str = Field("", description="file of the key that signs transactions: an eth "
                          "keystore (`meshrl keys new`) or one hex key (mode 0600)")
    password_file: str = Field("", description="file holding key_file's keystore password")
    password_env: str = Field("MESHRL_KEYSTORE_PASSWORD", description="environment variable "
                              "holding key_file's keystore password (without password_file)")
    rpc_timeout_s: float = Field(30.0, gt=0, description="seconds one JSON-RPC request may "
                                 "take before it fails (a worker keeps it below the pool's "
                                 "ejection budget)")
    ready_timeout_s: float = Field(5.0, gt=0, le=600, description="seconds a command waits "
                                   "at start for the JSON-RPC endpoint to answer before it "
                                   "gives up")
    chain_id: int = Field(0, description="refuse a node on another chain (84532: Base Sepolia)")

    _key = field_validator("private_key", mode="before")(hex_key)

    @model_validator(mode="after")
    def _one_key(self) -> ChainConfig:
        if self.private_key and self.key_file:
            raise ValueError("chain: give private_key or key_file, not both")
        return self


# Standard Ethereum JSON-RPC: reads and already-signed transactions. Nothing that signs with a
# key the node holds, changes its state outside a transaction, inspects it, or keeps state for
# the caller (server-side log filters: 20,000 of them were installed through the filter; meshrl's
# own clients read logs with `eth_getLogs`).
STANDARD_METHODS: tuple[str, ...] = (
    "eth_blockNumber", "eth_blobBaseFee", "eth_call", "eth_chainId", "eth_createAccessList",
    "eth_estimateGas", "eth_feeHistory", "eth_gasPrice", "eth_getBalance",
    "eth_getBlockByHash", "eth_getBlockByNumber", "eth_getBlockReceipts",
    "eth_getBlockTransactionCountByHash", "eth_getBlockTransactionCountByNumber",
    "eth_getCode", "eth_getLogs", "eth_getProof",
    "eth_getStorageAt", "eth_getTransactionByBlockHashAndIndex",
    "eth_getTransactionByBlockNumberAndIndex", "eth_getTransactionByHash",
    "eth_getTransactionCount", "eth_getTransactionReceipt", "eth_getUncleByBlockHashAndIndex",
    "eth_getUncleByBlockNumberAndIndex", "eth_getUncleCountByBlockHash",
    "eth_getUncleCountByBlockNumber", "eth_maxPriorityFeePerGas", "eth_protocolVersion",
    "eth_sendRawTransaction", "eth_syncing",
    "net_listening", "net_peerCount", "net_version", "web3_clientVersion", "web3_sha3",
)

# Refused whatever `allow` says (a config naming one does not load): the node's own powers
# (anvil's cheat codes, time travel, tracing, its unlocked accounts and what they sign or send)
# and state kept for the caller (log filters, subscriptions).
NEVER_PREFIXES: tuple[str, ...] = (
    "anvil_", "evm_", "hardhat_", "debug_", "personal_", "admin_", "miner_", "txpool_",
    "trace_", "ots_", "engine_", "eth_sign", "eth_newFilter", "eth_newBlockFilter",
    "eth_newPendingTransactionFilter", "eth_getFilter", "eth_uninstallFilter", "eth_subscribe",
    "eth_unsubscribe",
)
NEVER_METHODS: frozenset[str] = frozenset({
    "eth_accounts", "eth_sendTransaction", "eth_sendUnsignedTransaction", "eth_coinbase",
})


def never_forwarded(method: str) -> bool:
    """True for a method no public endpoint may forward (`NEVER_PREFIXES`, `NEVER_METHODS`)."""
    return method in NEVER_METHODS or method.startswith(NEVER_PREFIXES)


# A call that runs code is bounded by its gas: anvil computes on after the filter gives up (an
# endless loop with 2^40 gas ran for about an hour of a core). meshrl's heaviest call through a
# public RPC is the estimate of a 64-item `claim` (1.15 M gas measured, up to ~7 M when every
# item scans its provider's accusations); the protocol's deployment takes 5.25 M. 10 M: 10-15 ms
# of anvil for an endless loop (docs/joining.md).
MAX_CALL_GAS = 10_000_000


class FilterGuardConfig(GuardConfig):
    """The services' connection limits, tighter for a public JSON-RPC (a caller needs a few
    connections; each may hold a body of `max_body` in memory)."""

    max_connections: int = Field(1024, ge=1, description="open connections in all (also kept "
                                 "below the process's file descriptor limit)")
    max_connections_per_ip: int = Field(64, ge=1, description="open connections per source IP")
    body_timeout_s: float = Field(10.0, gt=0, description="seconds to send a (JSON) body")


class RpcFilterConfig(Config):
    """`meshrl chain rpc-filter`: a public JSON-RPC endpoint in front of a private node.

    What one caller (a source IP, an IPv6 /64) can make the node do is bounded: at most
    `per_caller` of its calls at the node at once (and `slots` of everyone's), each running code
    with at most `max_gas`, at most `max_waiting` more queued (served round robin by caller),
    each request answered or abandoned within `timeout_s`."""

    upstream: str = Field("http://127.0.0.1:8545", description="the node's JSON-RPC URL "
                          "(anvil on loopback; never expose it itself)")
    host: str = Field("127.0.0.1", description="listen address (the public one)")
    port: int = Field(8546, ge=0, lt=65536, description="listen port (0: any free port)")
    max_body: int = Field(512 << 10, ge=1024, description="largest request body (bytes)")
    max_batch: int = Field(100, ge=1, description="most calls in one batch")
    timeout_s: float = Field(10.0, gt=0, description="seconds a request may take, queue and "
                             "node included (its calls then answer with an error)")
    max_gas: int = Field(MAX_CALL_GAS, ge=100_000, description="gas of eth_call, "
                         "eth_estimateGas and eth_createAccessList: set when absent, lowered "
                         "when above")
    slots: int = Field(4, ge=1, description="calls at the node at once, all callers together")
    per_caller: int = Field(2, ge=1, description="calls at the node at once per caller (IP)")
    max_waiting: int = Field(200, ge=1, description="calls one caller may have queued; a "
                             "request that does not fit is refused at once (HTTP 429)")
    upstream_timeout_s: float = Field(60.0, gt=0, description="seconds a call may hold its "
                                      "slot at the node (past `timeout_s` too: the node "
                                      "computes on after the caller was answered)")
    guard: FilterGuardConfig = Field(FilterGuardConfig(), description="connection limits "
                                     "(the services' connection gate); its signed-request "
                                     "fields do not apply here")
    allow: list[str] = Field(list(STANDARD_METHODS), description="methods forwarded; every "
                             "other one is refused (node powers and log filters always are)")
    ready_file: str = Field("", description="write {url} here once listening (tests, scripts)")

    @field_validator("allow")
    @classmethod
    def _no_powers(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if never_forwarded(m)]
        if bad:
            raise ValueError(f"rpc filter: never forwarded on a public endpoint: {bad}")
        return v
