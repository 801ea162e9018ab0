"""Configuration of `meshrl worker` (torch-free, so `meshrl worker --help` answers fast)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from meshrl.config import Config
from meshrl.inference.params import (
    ComputeDtype,
    DeviceName,
    EngineConfig,
    ReferenceConfig,
    check_compute,
)
from meshrl.pool.rules import RulesPins
from meshrl.protocol.config import ChainConfig, hex_address

__all__ = [
    "CHEAT_MODES",
    "CheatConfig",
    "HardwareRequirements",
    "JoinConfig",
    "KeysConfig",
    "OnboardConfig",
    "WorkerCompute",
    "WorkerConfig",
]

CheatMode = Literal[
    "none", "other-model", "int8", "scale-layer", "cherry-pick", "forge-rewards",
    "forge-sampling", "truncate", "stale-policy", "copy", "inflate-units", "double-dip",
    "forge-one-row", "forge-tools", "double-submit",
]
CHEAT_MODES: tuple[str, ...] = CheatMode.__args__  # type: ignore[attr-defined]


class KeysConfig(Config):
    """Where the provider and node keys come from. Never a key on the command line."""

    provider_keystore: str = Field("", description="eth-account keystore file of the provider")
    node_keystore: str = Field("", description="eth-account keystore file of the node")
    password_env: str = Field(
        "MESHRL_KEYSTORE_PASSWORD", description="environment variable holding the password")
    password_file: str = Field("", description="file holding the password (instead of the env)")
    dev_index: int | None = Field(
        None, ge=0, le=999, description="local chains only: derive keys from anvil's test "
        "mnemonic, provider = account 2*i+1, node = account 2*i+2 (account 0 is the federator)")

    @model_validator(mode="after")
    def _one_source(self) -> KeysConfig:
        has_files = bool(self.provider_keystore or self.node_keystore)
        if self.dev_index is not None and has_files:
            raise ValueError("keys: give keystore files or dev_index, not both")
        return self


class HardwareRequirements(Config):
    """What the pool asks of a node (checked before onboarding)."""

    min_cpu_cores: int = Field(1, ge=1, description="logical CPU cores")
    min_memory_gb: float = Field(1.0, ge=0, description="total memory (GiB)")
    min_disk_gb: float = Field(0.5, ge=0, description="free disk under the work directory (GiB)")
    min_torch: str = Field("2.0", description="lowest torch version (major.minor)")
    python_packages: list[str] = Field(
        ["safetensors", "pyarrow"], description="packages that must import")


class CheatConfig(Config):
    """A dishonest worker, for tests of the validator. `none` in any real deployment."""

    mode: CheatMode = Field("none", description="the cheat: " + ", ".join(CHEAT_MODES))
    after_step: int = Field(-1, description="cheat only on steps > this (-1: from the start)")
    scale: float = Field(1.1, description="scale-layer: factor of one layer's MLP output")
    temperature: float = Field(0.0, ge=0, description="forge-sampling: the temperature used")
    copy_from: str = Field("", description="copy: another worker's outbox directory")
    other_seed: int = Field(12345, description="other-model: init seed of the other model")
    forge_task: str = Field("", max_length=64, description="forge-rewards: forge only the "
                            "rows of this task of the mix (its name; empty: every row)")
    double_order: Literal["batch-first", "file-first"] = Field(
        "batch-first", description="double-submit: whether each batch's first file is also "
        "submitted on its own after the batch's root (batch-first) or before it (file-first)")
    forge_row: int = Field(1, ge=0, description="forge-one-row: the row forged (mod the rows; "
                           "the next one if it starts a group)")


class WorkerCompute(Config):
    """Where and how a worker computes: backend, device and dtype (a network's per-worker
    setting; the worker's own fields of the same names)."""

    backend: Literal["engine", "reference"] = Field("engine", description="engine | reference")
    device: DeviceName = Field("cpu", description="cpu, cuda or cuda:N")
    dtype: ComputeDtype = Field("float32", description="float32 | bfloat16 | float16")

    @model_validator(mode="after")
    def _fits(self) -> WorkerCompute:
        check_compute(self.backend, self.device, self.dtype)
        return self


class OnboardConfig(Config):
    """On-chain onboarding amounts (token base units)."""

    stake: int = Field(0, ge=0, description="stake to register with; 0: the contract's minimum "
                       "for the node's compute units")
    compute_units: int = Field(1, ge=1, description="compute units the node is added with")


class WorkerConfig(Config):
    """`meshrl worker`: generate verified rollouts for one pool and earn its rewards."""

    pool_id: int = Field(1, ge=1, description="compute pool to work for")
    orchestrator_url: str = Field("http://127.0.0.1:8600", description="the pool's orchestrator")
    discovery_url: str = Field("http://127.0.0.1:8500", description="discovery service")
    work_dir: str = Field("runs/worker", description="outbox, policy versions and state")
    model_dir: str = Field("", description="initial policy (version 0) if shardcast has none")
    max_files: int = Field(0, ge=0, description="stop after submitting this many files (0: run)")
    poll_interval: float = Field(1.0, gt=0, description="seconds between work-order polls")
    work_wait_s: float = Field(5.0, ge=0, le=30, description="how long the orchestrator may "
                               "hold a work order while the pool wants no file (it answers as "
                               "soon as one is wanted; 0: poll every poll_interval)")
    http_timeout_s: float = Field(20.0, gt=0, description="seconds one request to a pool "
                                  "service may take (below the pool's ejection budget: "
                                  "dead_after x heartbeat interval)")
    status_line: Literal["auto", "on", "off"] = Field(
        "auto", description="a one-line live status on stdout (auto: when it is a terminal)")
    heartbeat_interval: float = Field(10.0, gt=0, description="seconds between heartbeats")
    policy_sync_timeout_s: float = Field(
        120.0, gt=0, description="most seconds a new policy version may take to arrive; past "
        "it the worker says so (one line, the status line) and keeps generating with the "
        "newest version it holds that the work order allows, then tries again")
    claim_every_s: float = Field(0.0, ge=0, description="claim this provider's claimable "
                                 "rewards in the pool every this many seconds, from this "
                                 "process (it owns the provider key's nonce: claim from no "
                                 "other process meanwhile); 0: never")
    challenge_verdicts: Literal["hard", "all", "off"] = Field(
        "hard", description="challenge the verdicts on this node's files while they are open "
        "(worker/defense.py): hard ones (default), all (soft ones too) or off; the deposit, "
        "half the verdict's bond from the provider's stake, comes back when it is overturned")
    watch_verdicts_s: float = Field(10.0, gt=0, description="seconds between reads of the "
                                    "chain for new verdicts on this node's files")
    claim_batch: int = Field(64, ge=1, le=64, description="work items per claim transaction "
                             "(the contract takes at most 64)")
    leave_on_stop: bool = Field(False, description="on SIGTERM / Ctrl-C, take the node out of "
                                "the pool on chain (`leave_pool`, signed by the node key) "
                                "before exiting, instead of being ejected after missed "
                                "heartbeats; the stake stays, so earned rewards stay claimable")
    crash_test_pause: float = Field(
        0.0, ge=0, description="crash tests only: pause this long at each phase boundary "
        "(counter taken, file written, slot granted, uploaded, submitted on chain), logging "
        "the phase, so a test can kill -9 the worker inside each phase")
    crash_test_phase: str = Field(
        "", max_length=64, description="crash tests only: pause only at this phase (its name "
        "as the `crash-test pause` log line gives it); empty: at every phase")
    backend: Literal["engine", "reference"] = Field(
        "engine", description="inference backend: meshrl's CPU engine ([engine], cpu and "
        "float32 only) or the naive Hugging Face loop ([reference], on `device` in `dtype`)")
    device: DeviceName = Field(
        "cpu", description="where the model runs: cpu, cuda or cuda:N (checked at start: a "
        "device this machine lacks is refused); generation, proofs' hidden states and the "
        "sampler all run there")
    dtype: ComputeDtype = Field(
        "float32", description="compute dtype: float32, bfloat16 or float16 (the engine "
        "always computes in float32); bfloat16 / float16 work is honest only in "
        "any-hardware pools")
    rules: RulesPins = Field(default_factory=RulesPins, description="rules this worker "
                             "expects: each one set must equal the pool's published value or "
                             "the worker refuses to start (it always generates by the "
                             "published rules)")
    keys: KeysConfig = KeysConfig()
    chain: ChainConfig = ChainConfig(rpc_timeout_s=10.0)
    onboard: OnboardConfig = OnboardConfig()
    engine: EngineConfig = EngineConfig()
    reference: ReferenceConfig = ReferenceConfig()
    hardware: HardwareRequirements = HardwareRequirements()
    cheat: CheatConfig = CheatConfig()

    @model_validator(mode="after")
    def _dtype(self) -> WorkerConfig:
        check_compute(self.backend, self.device, self.dtype)
        return self


class JoinConfig(WorkerConfig):
    """`meshrl worker join URL`: join a pool from anywhere by its orchestrator's URL (every
    `meshrl worker` option applies; the pool, discovery, chain RPC and contracts come from the
    pool's manifest, and nothing in it is trusted before the contributor's own RPC confirmed
    it: docs/joining.md)."""

    url: str = Field("", description="the pool's orchestrator (its GET /join manifest)")
    chain: ChainConfig = ChainConfig(rpc_url="", rpc_timeout_s=10.0)
    pin_deployment: str = Field("", description="a deployment file you trust (e.g. one the "
                                "pool's operator published): the manifest's chain id, token "
                                "and protocol must be the ones it names")
    pin_protocol: str = Field("", description="the protocol contract's address as you know "
                              "it from elsewhere: the manifest must name this one")
    work_dir: str = Field("runs/join", description="outbox, policy versions and state")
    keys: KeysConfig = KeysConfig(provider_keystore="keys/provider.json",
                                  node_keystore="keys/node.json")
    fund_poll_s: float = Field(5.0, gt=0, description="seconds between funding checks")
    fund_timeout_s: float = Field(0.0, ge=0, description="give up waiting for funds after "
                                  "this long (0: wait until funded or Ctrl-C)")
    provider_gas: int = Field(3_000_000, ge=0, description="gas the provider's ether must "
                              "cover before it starts (register, add the node, first "
                              "submissions), at twice the current gas price")
    node_gas: int = Field(400_000, ge=0, description="gas the node's ether must cover "
                          "(join_pool, rejoins), at twice the current gas price")
    clock_margin_s: float = Field(30.0, ge=0, description="refuse a clock within this much "
                                  "of the signature window's edge too")
    claim_every_s: float = Field(300.0, ge=0, description="claim this provider's claimable "
                                 "rewards every this many seconds, from this process (it owns "
                                 "the provider key's nonce: claim from no other process "
                                 "meanwhile); 0: never")
    leave_on_stop: bool = Field(True, description="on SIGTERM / Ctrl-C, leave the pool on chain "
                                "before exiting (the stake stays: earned rewards stay "
                                "claimable)")

    _pin = field_validator("pin_protocol", mode="before")(hex_address)

    @field_validator("url")
    @classmethod
    def _pool_url(cls, v: str) -> str:
        """The orchestrator's URL, also when given as its manifest's (`.../join`, as a page or a
        chat may pass it on)."""
        return v.strip().rstrip("/").removesuffix("/join").rstrip("/")
