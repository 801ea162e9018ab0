"""One unit of work: the assigned prompts of (node, step, counter, version), generated, scored
and proven.

The rules a validator replays are `meshrl.pool.assignment` (which problems, prompt encoding,
rows, seeds, work units; docs/roles.md); this module applies them with the loaded policy and
adds the proofs: `meshrl.toploc.build_proofs(final hidden states of the completion)`, made
for all rows of the file together (`build_proofs_many`).

Rows of a task with tools are episodes (`meshrl.pool.episode`): every row's turn is generated
together (one `generate` per distinct token budget), rows that ended on a call get their
tool's output appended and go on to their next turn, the others are done; an episode's proofs
are its model turns' proofs, in order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from meshrl.inference import InferenceBackend, SamplingParams
from meshrl.pool import Assignment, prompt_of_row
from meshrl.pool import work_units as count_units
from meshrl.pool.episode import (
    call_at_end,
    environment_tokens,
    episode_of,
    stop_strings,
    tool_runs,
    tool_seed,
    turn_seq_id,
)
from meshrl.tasks import TaskSet, compute_reward
from meshrl.toploc import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK, build_proofs_many
from meshrl.wire.rollout_file import Completion as Row
from meshrl.wire.rollout_file import RolloutFile, RolloutHeader

__all__ = ["generate_rollouts", "sampling_params", "work_units"]


def work_units(rows: list[Row]) -> int:
    """Tokens processed: every prompt token (prefilled) and every completion token (decoded)."""
    return count_units([len(r.prompt_tokens) for r in rows],
                       [len(r.completion_tokens) for r in rows])


def sampling_params(a: Assignment) -> SamplingParams:
    """The sampler's parameters for assignment `a`: the rules' sampling and the file's seed."""
    return SamplingParams(**a.rules.sampling.model_dump(), seed=a.sampler_seed(),
                          return_hidden_states=True)


@dataclass
class _Episode:
    """One row's episode so far: its segments (kind, tokens, log-probs, tool, exit, hidden)."""

    task: Any  # the built task when it runs tools, else None
    prompt: list[int]
    limit: int  # completion tokens at most (max_new_tokens, or the context)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    hidden: list[Any] = field(default_factory=list)  # per model segment
    finish_reason: str = "length"
    policy_version: int = -1

    def add(self, kind: int, ids: list[int], lps: list[float], tool: str = "",
            code: int = 0) -> None:
        self.tokens += ids
        self.logprobs += lps
        self.kinds.append(kind)
        self.lengths.append(len(ids))
        self.tools.append(tool)
        self.exits.append(code)


def _run_episodes(engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                  problems: list[Any], prompts: list[list[int]]) -> list[_Episode]:
    """Every row's episode, its turns batched across rows (a single-turn task's row is an
    episode of one turn, generated exactly as before)."""
    base, g = sampling_params(a), a.rules.group_size
    context = getattr(engine, "max_seq_len", None)
    eps = []
    for r, p in enumerate(prompts):
        limit = base.max_new_tokens if context is None else min(base.max_new_tokens,
                                                                   context - len(p))
        eps.append(_Episode(episode_of(tasks, problems[prompt_of_row(r, g)]), p, limit))
    active, turn = list(range(len(eps))), 0
    while active:
        batches: dict[tuple[int, tuple[str, ...]], list[int]] = defaultdict(list)
        for r in active:
            e = eps[r]
            # the engine clamps a budget to the context itself: rows of one turn share a batch
            batches[(base.max_new_tokens - len(e.tokens),
                     stop_strings(e.task) if e.task else ())].append(r)
        still = []
        for (budget, stops), rows in batches.items():
            params = base.model_copy(update={"max_new_tokens": budget, "stop_strings": stops})
            comps = engine.generate([eps[r].prompt + eps[r].tokens for r in rows], params,
                                    seq_ids=[turn_seq_id(r, turn) for r in rows])
            for r, c in zip(rows, comps, strict=True):
                e = eps[r]
                e.add(0, c.token_ids, c.logprobs)
                e.hidden.append(c.hidden_states)
                e.finish_reason, e.policy_version = c.finish_reason, c.policy_version
                if e.task is None or c.finish_reason != "stop":
                    continue
                call, _ = call_at_end(tokenizer, c.token_ids, e.task.tools)
                if call is None or not tool_runs(e.task, turn + 1, len(e.tokens), e.limit):
                    continue
                ids, res = environment_tokens(e.task, tokenizer, call,
                                              tool_seed(a.sampler_seed(), r, turn))
                e.add(1, ids, [0.0] * len(ids), call.tool.name, res.exit)
                still.append(r)
        active, turn = sorted(still), turn + 1
    return eps


def generate_rollouts(engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                      provider: str) -> RolloutFile:
    """Generate, score and prove the rollouts of assignment `a` with the loaded policy (`tasks`
    is `a.rules.task.build()`, built once by the worker)."""
    problems = a.problems(tasks)
    prompts = a.prompt_rows(tokenizer, problems)
    eps = _run_episodes(engine, tokenizer, a, tasks, problems, prompts)
    if any(e.policy_version != a.policy_version for e in eps):  # drawn for a.version
        raise RuntimeError(f"the engine holds policy version {eps[0].policy_version}, the "
                           f"assignment is for version {a.policy_version}")
    g = a.rules.group_size
    rows = []
    # all model segments' chunks at once, then each row's in order
    flat = build_proofs_many([h for e in eps for h in e.hidden])
    at = 0
    for r, e in enumerate(eps):
        proofs = [p for seg in flat[at:at + len(e.hidden)] for p in seg]
        at += len(e.hidden)
        reward = compute_reward(problems[prompt_of_row(r, g)], tokenizer.decode(e.tokens),
                                len(e.tokens), tasks)
        segs = {} if e.task is None else {
            "segment_kinds": e.kinds, "segment_lengths": e.lengths, "segment_tools": e.tools,
            "segment_exits": e.exits}
        rows.append(Row(prompt_id=a.prompt_id(r), counter=a.counter, sample_index=r % g,
                        seq_id=r, prompt_tokens=e.prompt, completion_tokens=e.tokens,
                        logprobs=e.logprobs, reward=reward.total,
                        finish_reason=e.finish_reason, toploc_proofs=proofs, **segs))
    header = RolloutHeader(
        node=a.node, provider=provider, pool_id=a.rules.pool_id, step=a.step,
        policy_version=a.policy_version, rules_sha256=a.rules.digest(),
        sampling_seed=a.sampler_seed(), toploc_chunk_size=DEFAULT_CHUNK_SIZE,
        toploc_topk=DEFAULT_TOPK, work_units=work_units(rows))
    return RolloutFile(header, rows)
