"""All checks of one rollout file, in order of cost: chain facts, assignment, rewards, replay.

`verify_files` takes files read with `meshrl.wire.read_rollout_file`, what the chain says about
each submission (`ChainClaim`) and the pool's public rules (`PoolRules`), plus the backend
holding the files' policy version, and returns every finding with the numbers behind it. The
prefill runs only for files whose rows are the node's own assigned prompts.
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
from meshrl.wire.rollout_file import RolloutFile

__all__ = ["ChainClaim", "PoolRules", "Report", "model_free_findings", "verify_file",
           "verify_files"]


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
    sampling: dict[str, Any]  # max_new_tokens, temperature, top_p
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


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """BOS (when the tokenizer has one) then the text: the worker's rule."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + tokenizer.encode(text)


def _counter(rf: RolloutFile) -> int | Finding:
    counters = {c.counter for c in rf.completions}
    if len(counters) != 1:
        return Finding("prompts", "hard", f"rows from {len(counters)} counters in one file")
    return counters.pop()


def _claimed_sampling(rules: PoolRules) -> dict[str, Any]:
    return {**rules.sampling, "group_size": rules.group_size}


def model_free_findings(rf: RolloutFile, claim: ChainClaim, rules: PoolRules,
                        tokenizer: Any) -> list[Finding]:
    """Every check that needs no model: node, units, assignment, version window, rewards."""
    h, rows = rf.header, rf.completions
    counter = _counter(rf)
    if isinstance(counter, Finding):
        return [counter]
    out = [check_node(h.node, h.provider, claim.node, claim.provider),
           check_work_units(h.work_units, claim.units, [len(r.prompt_tokens) for r in rows],
                            [len(r.completion_tokens) for r in rows]),
           check_policy_version(h.policy_version, h.step, rules.async_level),
           check_sampling_params(h.sampling, _claimed_sampling(rules), h.sampling_seed,
                                 sampling_seed(rules.seed, h.node, h.step, counter))]
    tasks = rules.tasks.build()
    problems: list[Problem] = sample_problems(tasks, rules.seed, h.node, h.step, counter,
                                              rules.prompts_per_file)
    out.append(check_prompts([r.prompt_tokens for r in rows],
                             [encode_prompt(tokenizer, p.prompt) for p in problems],
                             rules.group_size))
    if out[-1] is None:
        g = rules.group_size
        recomputed = [compute_reward(problems[i // g], tokenizer.decode(r.completion_tokens),
                                     len(r.completion_tokens), tasks).total
                      for i, r in enumerate(rows)]
        out.append(check_rewards([r.reward for r in rows], recomputed))
    bad_seq = [i for i, r in enumerate(rows) if r.seq_id != i]
    if bad_seq:
        out.append(Finding("seq_ids", "hard", f"{len(bad_seq)} rows do not use seq_id = row "
                           f"index, first row {bad_seq[0]}"))
    return [x for x in out if x is not None]


def _spec(rf: RolloutFile, rules: PoolRules, tokenizer: Any,
          max_seq_len: int | None) -> ReplaySpec:
    s = rules.sampling
    return ReplaySpec(seed=rf.header.sampling_seed, max_new_tokens=int(s["max_new_tokens"]),
                      temperature=float(s.get("temperature", 1.0)),
                      top_p=float(s.get("top_p", 1.0)),
                      eos_token_ids=() if s.get("ignore_eos") else
                      (int(tokenizer.eos_token_id),),
                      stop_token_ids=tuple(s.get("stop_token_ids", ())),
                      max_seq_len=max_seq_len)


def _rows(rf: RolloutFile) -> list[ReplayRow]:
    return [ReplayRow(r.prompt_tokens, r.completion_tokens, r.logprobs, r.finish_reason,
                      r.seq_id, r.toploc_proofs) for r in rf.completions]


def verify_files(backend: InferenceBackend, tokenizer: Any,
                 items: Sequence[tuple[RolloutFile, ChainClaim, PoolRules]],
                 cfg: ReplayConfig | None = None) -> list[Report]:
    """Reports for several files of one policy version; their replays share prefill batches."""
    cfg = cfg or ReplayConfig()
    reports = [Report(model_free_findings(f, c, r, tokenizer)) for f, c, r in items]
    # the seed and prompts of a file that is not the node's own assignment mean nothing
    todo = [i for i, rep in enumerate(reports)
            if not any(x.check in ("prompts", "node", "sampling_params") for x in rep.findings)]
    max_len = getattr(backend, "max_seq_len", None)
    batch = [(_rows(items[i][0]), _spec(items[i][0], items[i][2], tokenizer, max_len))
             for i in todo]
    for i, (found, stats) in zip(todo, replay_files(backend, batch, cfg), strict=True):
        reports[i].findings += found
        reports[i].stats = stats
    return reports


def verify_file(backend: InferenceBackend, tokenizer: Any, rf: RolloutFile, claim: ChainClaim,
                rules: PoolRules, cfg: ReplayConfig | None = None) -> Report:
    return verify_files(backend, tokenizer, [(rf, claim, rules)], cfg)[0]
