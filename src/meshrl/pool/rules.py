"""The pool's rules, typed: what every worker generates by and every validator judges by.

An orchestrator publishes them (`GET /rules`, unsigned, and inside every work order); a worker
reads them before it stakes and a validator before it judges. They are the only source of a rule
for the roles that generate or judge: a role's own config may *pin* a rule (`RulesPins`) to
say what it expects, and a pin that differs from the published value refuses the role at start
(`rules_drift`), so an operator's typo can never judge an honest file by the wrong rule.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from eth_utils import is_checksum_address
from pydantic import BaseModel, ConfigDict, Field, field_validator

from meshrl.pool.profiles import PROFILE_FIELD, ProofProfile
from meshrl.pool.sampled import FULL_REPLAY, ReplayRule
from meshrl.tasks import TasksConfig

__all__ = ["NO_BATCHES", "PROMPT_FORMAT_FIELD", "RULE_FIELDS", "BatchRule", "PoolRules",
           "PromptFormat", "RulesPins",
           "RulesSpec", "SamplingSpec", "policy_run", "rules_diff", "rules_drift",
           "tasks_config"]


class _Rule(BaseModel):
    # frozen: a rule read once is never edited in place by the role that holds it
    model_config = ConfigDict(extra="forbid", frozen=True)


def tasks_config(task: Any) -> TasksConfig:
    """A task spec as written in configs: a whole tasks config (`mix = [...]`) or one task of
    the mix (`type = "arithmetic"`, ...). The one parser of task specs."""
    if isinstance(task, TasksConfig):
        return task
    if isinstance(task, dict) and "mix" not in task and "type" in task:
        task = {"mix": [task]}
    return TasksConfig.model_validate(task)


def _pinned_data(task: TasksConfig) -> TasksConfig:
    """A published rule that reads a file from every worker's disk must pin its digest: a pool
    that names a path it cannot hash (a keystore, a home file) could otherwise have its
    contents encoded into prompts and sent back in rollout files."""
    for i, spec in enumerate(task.mix):
        path = getattr(spec, "path", None)
        if spec.type in ("dataset", "code", "math") and not str(path).startswith("meshrl:") \
                and getattr(spec, "sha256", None) is None:
            raise ValueError(f"task.mix.{i} ({spec.type}) reads {path!r}: a pool's rule pins "
                             f"the data's sha256 (meshrl.tasks.dataset.data_digest)")
    return task


def _signer(v: str | None) -> str | None:
    if v is not None and not is_checksum_address(v):
        raise ValueError(f"{v!r} is not a checksummed Ethereum address")
    return v


PromptFormat = Literal["raw", "chat", "auto"]
PROMPT_FORMAT_FIELD = (
    "how a problem's prompt becomes tokens (`meshrl.pool.encode_prompt`): raw = [BOS] + the "
    "text; chat = the text as the user turn of the policy tokenizer's chat template, ending "
    "where the assistant answers (a policy without a template is refused); auto = chat when "
    "the policy's tokenizer has a chat template, else raw")


class SamplingSpec(_Rule):
    """How completions are sampled (the seed is not a rule: it is derived per file)."""

    max_new_tokens: int = Field(64, ge=1, le=1 << 16, description="completion length cap")
    temperature: float = Field(1.0, ge=0.0, le=100.0, allow_inf_nan=False,
                               description="softmax temperature (0: greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False,
                         description="nucleus mass kept")
    ignore_eos: bool = Field(False, description="generate past EOS (benchmarks only)")
    stop_token_ids: tuple[int, ...] = Field((), max_length=64,
                                            description="extra token ids that end a completion")


class BatchRule(_Rule):
    """How a node submits its files on chain (issue 46, docs/protocol.md "Batches"): `files`
    per batch (one Merkle root per transaction), and at most `max_delay_s` between a file's
    upload and the submission of the partial batch that holds it. `files = 1`: every file is
    its own `submit_work` (the behaviour of pools from before batches)."""

    files: int = Field(1, ge=1, le=256, description="files per on-chain submission (1: each "
                       "file its own submit_work; more: submit_batch of up to this many)")
    max_delay_s: float = Field(10.0, ge=0.0, le=3600.0, allow_inf_nan=False,
                               description="seconds an uploaded file may wait for its batch to "
                               "fill before the partial batch is submitted")


NO_BATCHES = BatchRule()


class RulesSpec(_Rule):
    """Every rule of a pool but its id (an orchestrator's `[rules]` table)."""

    task: TasksConfig = Field(default_factory=TasksConfig, description="the tasks mix (one "
                              "task or `mix = [...]`)")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="how completions "
                                   "are sampled")
    group_size: int = Field(1, ge=1, le=1024, description="completions per prompt")
    prompts_per_file: int = Field(8, ge=1, le=4096, description="prompts per rollout file")
    files_per_step: int = Field(8, ge=1, le=1 << 16, description="files a node may make per "
                                "step: its counters are 0 .. files_per_step - 1")
    async_level: int = Field(2, ge=0, le=1024, description="policy versions a file may lag "
                             "its step")
    seed: int = Field(0, ge=0, lt=2**63, description="base seed prompts and sampling derive from")
    proof_profile: ProofProfile = Field("any-hardware", description=PROFILE_FIELD)
    prompt_format: PromptFormat = Field("raw", description=PROMPT_FORMAT_FIELD)
    policy_signer: str | None = Field(None, description="checksummed address whose EIP-191 "
                                      "signature every policy version's shardcast manifest "
                                      "carries (the trainer's key); unset: no policy version "
                                      "can be authenticated, workers and validators refuse to "
                                      "fetch one")
    replay: ReplayRule = Field(default_factory=ReplayRule, description="which rows of each "
                               "file a validator replays on the model (sampled replay, "
                               "pool/sampled.py; the other checks cover every row)")
    batch: BatchRule = Field(default_factory=BatchRule, description="how nodes submit their "
                             "files on chain: files per batch and the longest wait of a "
                             "partial batch (files = 1: one submit_work per file)")

    _task = field_validator("task", mode="before")(tasks_config)
    _pinned = field_validator("task")(_pinned_data)
    _signer = field_validator("policy_signer")(_signer)

    def rows_per_file(self) -> int:
        return self.prompts_per_file * self.group_size


def _canonical(model: BaseModel) -> bytes:
    data = model.model_dump(mode="json")
    if data.get("policy_signer", "") is None:
        del data["policy_signer"]  # unset: the digest of rules from before the field
    if data.get("replay") == FULL_REPLAY.model_dump(mode="json"):
        del data["replay"]  # full replay: the digest of rules from before sampled replay
    if data.get("prompt_format") == "raw":
        del data["prompt_format"]  # likewise: raw prompts were the only kind before it
    if data.get("batch") == NO_BATCHES.model_dump(mode="json"):
        del data["batch"]  # per-file submission: the digest of rules from before batches
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def policy_run(pool_id: int) -> str:
    """The run id every policy version's shardcast manifest of pool `pool_id` names, inside the
    trainer's signature: a version the same key signed for another pool is refused by every
    relay, worker and validator of this one (docs/shardcast.md)."""
    return f"pool-{int(pool_id)}"


class PoolRules(RulesSpec):
    """The published rules of one pool (`GET /rules`, and the `rules` of every work order)."""

    pool_id: int = Field(ge=1, description="the compute pool these rules govern")

    def digest(self) -> str:
        """sha256 (hex) of the rules' canonical JSON: what a rollout file's header names as the
        rules it was generated under."""
        return hashlib.sha256(_canonical(self)).hexdigest()

    def policy_run(self) -> str:
        """The run id every policy version's shardcast manifest of this pool names."""
        return policy_run(self.pool_id)


RULE_FIELDS: tuple[str, ...] = tuple(RulesSpec.model_fields)


class RulesPins(BaseModel):
    """The rules a worker or validator expects (its `[rules]` table). Each one left unset is
    taken as published; each one set must equal the published value or the role refuses to
    start (docs/roles.md)."""

    model_config = ConfigDict(extra="forbid")

    task: TasksConfig | None = None
    sampling: SamplingSpec | None = None
    group_size: int | None = None
    prompts_per_file: int | None = None
    files_per_step: int | None = None
    async_level: int | None = None
    seed: int | None = None
    proof_profile: ProofProfile | None = None
    prompt_format: PromptFormat | None = None
    policy_signer: str | None = None
    replay: ReplayRule | None = None
    batch: BatchRule | None = None

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, v: Any) -> Any:
        return None if v is None else tasks_config(v)

    @classmethod
    def of(cls, rules: RulesSpec) -> RulesPins:
        """Pins of every rule to `rules`' values."""
        return cls.model_validate({k: getattr(rules, k) for k in RULE_FIELDS})


def _leaves(a: Any, b: Any, path: str) -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _leaves(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _leaves(x, y, f"{path}.{i}")]
    return [] if a == b else [(path, a, b)]


def _json(v: Any) -> Any:
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else v


def rules_diff(pins: RulesPins, published: RulesSpec) -> list[tuple[str, Any, Any]]:
    """(field, pinned value, published value) for every pinned rule that differs from the
    published one, the field dotted down to the leaf that differs (`sampling.top_p`,
    `task.mix.0.digits`); empty when every pin agrees."""
    out = []
    for name in RULE_FIELDS:
        mine = getattr(pins, name)
        if mine is not None:
            out += _leaves(_json(mine), _json(getattr(published, name)), name)
    return out


def rules_drift(pins: RulesPins, published: RulesSpec) -> list[str]:
    """One line per pinned rule whose value differs from the published one, naming the field
    (`rules_diff`); empty when every pin agrees."""
    return [f"rules.{path}: configured {a!r}, the pool publishes {b!r}"
            for path, a, b in rules_diff(pins, published)]
