"""`meshrl network up`: the shape of a local network (torch-free, so `--help` answers fast).

Threads. On one machine every role shares the cores, and a torch kernel that spins on several
threads while another process holds a core is slowed many times over (TOPLOC at 2 threads ran
20-35x slower next to a busy process; at 1 thread it did not). So each role gets a thread count
here: it is written into the role's own config (`engine.num_threads` of workers and validator,
`run.threads` of the trainer) and into the role's environment as `OMP_NUM_THREADS` /
`MKL_NUM_THREADS` (the services and shardcast use no torch: 1).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from meshrl.config import Config
from meshrl.pool import PROFILE_FIELD, PROMPT_FORMAT_FIELD, PromptFormat, ProofProfile, RulesSpec
from meshrl.protocol.config import ProtocolParams
from meshrl.worker.config import WorkerCompute

__all__ = ["CheatSpec", "KeysSpec", "NetworkConfig", "PoolSpec", "ThreadsConfig",
           "ValidatorsSpec", "WorkersSpec"]

TOKEN = 10**18


class ThreadsConfig(Config):
    """torch threads per role process (see the module docstring)."""

    trainer: int = Field(1, ge=1, description="the trainer's torch threads")
    validator: int = Field(1, ge=1, description="the validator's engine threads")
    worker: int = Field(1, ge=1, description="each worker's engine threads")


class KeysSpec(Config):
    """Where the roles' keys come from (meshrl/network/keys.py). A pool opened to other hosts
    (`public_host`) refuses to start on a key of anvil's public test mnemonic."""

    source: Literal["auto", "dev", "generate"] = Field(
        "auto", description="dev: derive every role's key from anvil's public test mnemonic "
        "(loopback demos only); generate: read each role's key from keys.dir, generating the "
        "missing ones there (mode 0600); auto: generate for a pool opened to other hosts, when "
        "keys.dir is set or when the run already has generated keys, else dev")
    dir: str = Field("", description="the keys' directory (empty: <dir>/<name>/keys): "
                     "federator.key, manager.key, trainer.key (one hex key each, mode 0600), "
                     "<validator>.json and <worker>-provider.json / <worker>-node.json (eth "
                     "keystores); your own keys go here, the missing ones are generated")
    password_file: str = Field("", description="the keystores' password file (empty: "
                               "<keys dir>/password, generated with the keys)")


class CheatSpec(Config):
    mode: str = Field("forge-rewards", description="worker.cheat.mode of the dishonest worker")
    after_step: int = Field(3, ge=-1, description="honest up to this pool step, then cheats")


class WorkersSpec(Config):
    honest: int = Field(3, ge=0, description="honest workers")
    dishonest: int = Field(1, ge=0, description="workers that turn dishonest")
    cheat: CheatSpec = CheatSpec()
    forge_tasks: list[str] = Field(
        default_factory=list, description="forge-rewards: per dishonest worker, in order, the "
        "task of the mix whose rows it forges (worker.cheat.forge_task), e.g. one cheater per "
        "task kind; cheaters past the list forge every row")
    poll_interval: float = Field(0.25, gt=0, description="seconds between work-order polls")
    heartbeat_interval: float = Field(2.0, gt=0, description="seconds between heartbeats")
    claim_every_s: float = Field(0.0, ge=0, description="each worker claims its provider's "
                                 "claimable rewards this often (0: never; a pool that drains "
                                 "on stop needs it, or its own workers' rewards stay unclaimed)")
    compute: list[WorkerCompute] = Field(
        default_factory=list, description="per worker, in order (the honest ones, then the "
        "dishonest): its backend, device and dtype, e.g. [{backend = \"engine\"}, "
        "{backend = \"reference\", dtype = \"bfloat16\"}] for a mixed-precision pool; "
        "workers past the list use the worker defaults (CPU engine, float32)")


class ValidatorsSpec(Config):
    """The pool's validators. They split the files (validator i of n judges the work ids that
    are i mod n) and each re-judges, and votes on, every file another one accused, so n
    validators cost about what one does, and no verdict is one key's word."""

    count: int = Field(2, ge=1, le=8, description="validators, each with its own key and bond")
    audit: float = Field(0.1, ge=0, le=1, description="fraction of the other validators' "
                         "files each one judges too (validator.share.audit)")
    rogue: int = Field(0, ge=0, description="of them, this many (the last ones) are rogue: "
                       "they hard-invalidate honest files (`meshrl adversary validator` with "
                       "rogue.mode; tests and demos of disputes only)")
    rogue_accusations: int = Field(2, ge=1, description="honest files each rogue accuses")
    bond_verdicts: int = Field(32, ge=0, description="open verdicts each validator's bond "
                               "covers (chain.verdict_bond each)")

    @model_validator(mode="after")
    def _some_honest(self) -> ValidatorsSpec:
        if self.rogue >= self.count:
            raise ValueError("validators.rogue: at least one validator must be honest")
        return self


LOCAL_ASYNC_LEVEL = 2  # every member on this host: a file lags by a step or two
# a public pool: a member 80 ms and 20 Mbit/s away fetches a 3.2 MB version in ~5 s and its
# file reaches the trainer ~5-10 s after its order, 10-15 versions at the demo's pace
PUBLIC_ASYNC_LEVEL = 24


class PoolSpec(Config):
    """The pool's public rules: the orchestrator's `[rules]` (what it publishes), the pins of
    every validator and worker (`[rules]`, checked against the published ones at start) and the
    trainer's rollout shape all come from here."""

    task: dict[str, Any] = Field(default_factory=lambda: {"mix": [{"type": "arithmetic"}]},
                                 description="tasks config (the trainer's held-out set too)")
    max_new_tokens: int = Field(8, ge=1, description="completion length cap")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    group_size: int = Field(8, ge=2, description="completions per prompt")
    prompts_per_file: int = Field(8, ge=1, description="prompts per rollout file")
    async_level: int = Field(-1, ge=-1, description="policy versions a file may lag its step "
                             f"(-1: {LOCAL_ASYNC_LEVEL}, or {PUBLIC_ASYNC_LEVEL} in a public pool "
                             "(public_host), whose far members' files lag by their fetch, "
                             "upload, submission and judging: docs/joining.md)")
    seed: int = Field(11, ge=0, description="base seed prompts derive from")
    files_per_step: int = Field(8, ge=1, description="files each worker may make per policy "
                                "version (its counters). The trainer's pacing decides how many "
                                "are made; this is only the cap, so keep it at least the "
                                "trainer's files per batch plus one (one member alone can fill "
                                "a step whose files lost held-out groups)")
    proof_profile: ProofProfile = Field(
        "any-hardware", description=PROFILE_FIELD + " (the orchestrator publishes it, the "
        "validator judges by it; meshrl-cpu-engine only when every worker runs meshrl's engine)")
    replay_rows_fraction: float = Field(0.25, gt=0, le=1, description="rules.replay."
                                        "rows_fraction: the share of each file's rows the "
                                        "validator replays on the model (docs/economics.md)")
    prompt_format: PromptFormat = Field("raw", description=PROMPT_FORMAT_FIELD)
    batch_files: int = Field(1, ge=1, le=256, description="rules.batch.files: files a worker "
                             "submits on chain in one batch (1: each file its own "
                             "submit_work; docs/protocol.md, Batches)")
    batch_max_delay_s: float = Field(10.0, ge=0, le=3600, description="rules.batch."
                                     "max_delay_s: how long a file may wait for its batch to "
                                     "fill before the partial batch is submitted")
    reward_rate: int = Field(10**15, ge=0, description="token base units per work unit")
    heartbeat_s: float = Field(2.0, gt=0, description="the orchestrator's heartbeat interval")
    dead_after: int = Field(15, ge=1, description="missed heartbeats before a node is ejected")

    def rules(self) -> RulesSpec:
        """The rules the orchestrator publishes, and every worker and validator pins."""
        return RulesSpec(task=self.task, group_size=self.group_size,
                         sampling={"max_new_tokens": self.max_new_tokens,
                                   "temperature": self.temperature, "top_p": 1.0},
                         prompts_per_file=self.prompts_per_file, async_level=self.async_level,
                         seed=self.seed, files_per_step=self.files_per_step,
                         proof_profile=self.proof_profile, prompt_format=self.prompt_format,
                         replay={"rows_fraction": self.replay_rows_fraction},
                         batch={"files": self.batch_files,
                                "max_delay_s": self.batch_max_delay_s})


# a local network's chain: short periods; a verdict puts 10 tokens of its validator's bond at
# stake and can be disputed for 60 s (a challenge leaves 30 s to vote; one other validator's
# vote upholds it): a slash is final about a minute after the accusation, while the accused
# file's reward and its node's place in the pool are taken at the accusation. The period is
# the time the other validators have to re-judge the file on a loaded machine: a vote after it
# is refused, and an unchallenged verdict stands.
NETWORK_CHAIN = ProtocolParams(
    min_stake=100 * TOKEN, stake_per_unit=10 * TOKEN, unbonding_delay=600,
    invalidation_window=600, lock_period=600, slash_penalty=50 * TOKEN,
    verdict_bond=10 * TOKEN, dispute_period=60, vote_period=30, quorum=1)


class NetworkConfig(Config):
    """`meshrl network up`: anvil, discovery, orchestrator, shardcast, trainer, validator and
    workers as separate processes on loopback, supervised."""

    name: str = Field("network", description="run directory name under dir")
    dir: str = Field("runs", description="parent directory of runs")
    base_port: int = Field(18540, ge=1024, le=65000, description="first of the ports used: "
                           "anvil, discovery, orchestrator, origin, relays, in that order")
    relays: int = Field(2, ge=0, le=10, description="shardcast relays under the origin")
    public_host: str = Field("", description="an address of this host that contributors "
                             "reach: discovery, the orchestrator, the shardcast servers and "
                             "a filtered chain RPC (base_port + 14, standard methods only) "
                             "listen and are advertised on it; anvil, the trainer and the "
                             "dashboard stay on loopback (empty: everything on loopback)")
    dashboard: bool = Field(True, description="serve the live page at base_port + 15")
    train_config: str = Field("configs/arithmetic.toml", description="the trainer's RL config")
    train: dict[str, Any] = Field(default_factory=dict, description="RL config keys that "
                                  "override train_config (nested tables)")
    max_minutes: float = Field(0.0, ge=0, description="stop the network after this long (0: "
                               "when the trainer finishes)")
    after_training: Literal["stop", "serve"] = Field(
        "stop", description="when the trainer finishes: stop the network, or keep serving it "
        "(dashboard, claims) until Ctrl-C")
    on_stop: Literal["stop", "drain"] = Field(
        "stop", description="what Ctrl-C, SIGTERM, max_minutes or a finished trainer do: stop "
        "every role at once (the demo), or drain: stop taking work (trainer, validators, "
        "orchestrator, discovery, shardcast) and keep the chain, its public RPC, the dashboard "
        "and the pool's own workers (they claim) up until every reward earned in the pool is "
        "claimed or the last one has been claimable for claim_window_s; a second Ctrl-C stops "
        "at once and says what is left (meshrl/network/closing.py)")
    claim_window_s: float = Field(900.0, ge=0, description="drain: how long (chain time) the "
                                  "last reward to unlock stays claimable before the chain "
                                  "closes; keep it above the members' claim interval "
                                  "(worker join: claim_every_s, 300 s)")
    faults: str = Field("", description="fault plan: TOML with [[kill]] role/at_s tables "
                        "(see meshrl/network/faults.py)")
    restart_backoff_s: float = Field(1.0, gt=0, description="first delay before a restart")
    max_fast_deaths: int = Field(5, ge=1, description="give up on a role that dies this many "
                                 "times in a row within 10 s of its start")
    anvil: str = Field("", description="anvil binary (default: node_modules/.bin, then PATH)")
    fork_roles: bool = Field(True, description="start each meshrl role by forking a server "
                             "that imported the roles once (meshrl/network/launcher.py: about "
                             "2 CPU-s less per start); false: a fresh interpreter per role")
    chain: ProtocolParams = Field(default_factory=lambda: NETWORK_CHAIN, description="the "
                                  "chain's parameters; a [chain] table changes only the keys "
                                  "it names")
    poll_s: float = Field(0.25, gt=0, description="how often the orchestrator reads the chain and "
                          "the validator and trainer look for new work: each poll is latency "
                          "on every step's path from a worker to the trainer")
    threads: ThreadsConfig = ThreadsConfig()
    keys: KeysSpec = KeysSpec()
    workers: WorkersSpec = WorkersSpec()
    validators: ValidatorsSpec = ValidatorsSpec()
    pool: PoolSpec = PoolSpec()

    @field_validator("chain", mode="before")
    @classmethod
    def _chain_over_defaults(cls, v: object) -> object:
        # a table names what it changes; the rest keeps the network's values, not the protocol's
        if isinstance(v, dict):
            return {**NETWORK_CHAIN.model_dump(), **v}
        return v

    @model_validator(mode="after")
    def _slack(self) -> NetworkConfig:
        if self.pool.async_level < 0:  # the default: by whether members may be far away
            self.pool.async_level = PUBLIC_ASYNC_LEVEL if self.public_host else LOCAL_ASYNC_LEVEL
        return self

    @field_validator("public_host")
    @classmethod
    def _routable(cls, v: str) -> str:
        if v in ("0.0.0.0", "::", "[::]"):
            raise ValueError("public_host: name the address contributors reach (it is "
                             "advertised in every URL), not a wildcard")
        if any(c in v for c in "/: ") and not v.startswith("["):
            raise ValueError(f"public_host: a host name or address, not {v!r}")
        return v
