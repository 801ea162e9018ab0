"""All checks of one rollout file, in order of cost: chain facts, assignment, rewards, replay.

`verify_file` takes what the validator read from the file (`FileView`), what the chain says
about the submission (`ChainClaim`) and the pool's public rules (`PoolRules`), plus the engine
holding the file's policy version, and returns every finding with the numbers behind it.
Cheap checks run first; the prefill runs only when the model-free checks leave it meaningful.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshrl.inference import InferenceBackend
from meshrl.tasks import Problem, TasksConfig, compute_reward, sample_problems, sampling_seed
from meshrl.validator.checks import (
    Finding,
    check_node,
    check_policy_version,
    check_prompts,
    check_rewards,
    check_sampling_params,
    check_work_units,
)
from meshrl.validator.replay import ReplayConfig, ReplayRow, ReplaySpec, ReplayStats, replay_files

__all__ = ["ChainClaim", "FileRow", "FileView", "PoolRules", "Report", "model_free_findings",
           "verify_file", "verify_files"]


@dataclass
class FileRow:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    seq_id: int
    reward: float
    proofs: list[bytes]


@dataclass
class FileView:
    """The content of a rollout file as the validator uses it."""

    node: str
    provider: str
    step: int
    counter: int
    policy_version: int
    seed: int
    sampling: dict[str, Any]  # max_new_tokens, temperature, top_p
    group_size: int
    work_units: int
    rows: list[FileRow]


@dataclass(frozen=True)
class ChainClaim:
    """The `WorkSubmitted` facts: who submitted which hash for how many units."""

    sha256: str
    node: str
    provider: str
    units: int


@dataclass(frozen=True)
class PoolRules:
    """The pool's public rules for a step (from its work order)."""

    seed: int
    async_level: int
    prompts_per_file: int
    group_size: int
    sampling: dict[str, Any]
    tasks: TasksConfig


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    stats: ReplayStats | None = None

    @property
    def accepted(self) -> bool:
        return not self.findings

    @property
    def hard(self) -> bool:
        return any(f.severity == "hard" for f in self.findings)

    def reason(self) -> str:
        return "; ".join(f.text() for f in self.findings) or "all checks passed"


def _assigned(f: FileView, rules: PoolRules, tokenizer: Any) -> list[Problem]:
    return sample_problems(rules.tasks, rules.seed, f.node, f.step, f.counter,
                           rules.prompts_per_file)


def _encode(tokenizer: Any, text: str) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + tokenizer.encode(text)


def model_free_findings(f: FileView, claim: ChainClaim, rules: PoolRules,
                        tokenizer: Any) -> list[Finding]:
    """Every check that needs no model: node, units, assignment, version window, rewards."""
    out = [check_node(f.node, f.provider, claim.node, claim.provider),
           check_work_units(f.work_units, claim.units, [len(r.prompt_ids) for r in f.rows],
                            [len(r.token_ids) for r in f.rows]),
           check_policy_version(f.policy_version, f.step, rules.async_level),
           check_sampling_params({**f.sampling, "group_size": f.group_size},
                                 {**rules.sampling, "group_size": rules.group_size},
                                 f.seed, sampling_seed(rules.seed, f.node, f.step, f.counter))]
    problems = _assigned(f, rules, tokenizer)
    out.append(check_prompts([r.prompt_ids for r in f.rows],
                             [_encode(tokenizer, p.prompt) for p in problems], rules.group_size))
    if out[-1] is None:
        tasks = rules.tasks.build()
        g = rules.group_size
        recomputed = [compute_reward(problems[i // g], tokenizer.decode(r.token_ids),
                                     len(r.token_ids), rules.tasks, tasks).total
                      for i, r in enumerate(f.rows)]
        out.append(check_rewards([r.reward for r in f.rows], recomputed))
    bad_seq = [i for i, r in enumerate(f.rows) if r.seq_id != i]
    if bad_seq:
        out.append(Finding("seq_ids", "hard", f"{len(bad_seq)} rows do not use seq_id = row "
                           f"index, first row {bad_seq[0]}"))
    return [x for x in out if x is not None]


def _spec(f: FileView, rules: PoolRules, tokenizer: Any, max_seq_len: int | None) -> ReplaySpec:
    s = rules.sampling
    return ReplaySpec(seed=sampling_seed(rules.seed, f.node, f.step, f.counter),
                      max_new_tokens=int(s["max_new_tokens"]),
                      temperature=float(s.get("temperature", 1.0)),
                      top_p=float(s.get("top_p", 1.0)),
                      eos_token_ids=(int(tokenizer.eos_token_id),),
                      stop_token_ids=tuple(s.get("stop_token_ids", ())),
                      max_seq_len=max_seq_len)


def verify_files(engine: InferenceBackend, tokenizer: Any,
                 items: Sequence[tuple[FileView, ChainClaim, PoolRules]],
                 cfg: ReplayConfig | None = None) -> list[Report]:
    """Reports for several files of one policy version; their replays share prefill batches."""
    cfg = cfg or ReplayConfig()
    reports = [Report(model_free_findings(f, c, r, tokenizer)) for f, c, r in items]
    # a file whose rows are not its assigned ones, or not its own, is judged already
    todo = [i for i, rep in enumerate(reports)
            if not any(x.check in ("prompts", "node") for x in rep.findings)]
    max_len = getattr(engine, "max_seq_len", None)
    batch = [([ReplayRow(r.prompt_ids, r.token_ids, r.logprobs, r.finish_reason, r.seq_id,
                         r.proofs) for r in items[i][0].rows],
              _spec(items[i][0], items[i][2], tokenizer, max_len)) for i in todo]
    for i, (found, stats) in zip(todo, replay_files(engine, batch, cfg), strict=True):
        reports[i].findings += found
        reports[i].stats = stats
    return reports


def verify_file(engine: InferenceBackend, tokenizer: Any, f: FileView, claim: ChainClaim,
                rules: PoolRules, cfg: ReplayConfig | None = None) -> Report:
    return verify_files(engine, tokenizer, [(f, claim, rules)], cfg)[0]
