"""One unit of work: the assigned prompts of (node, counter, policy version), generated, scored
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

from typing import Any

from meshrl.inference import InferenceBackend, SamplingParams
from meshrl.pool import Assignment, prompt_of_row
from meshrl.pool import work_units as count_units
from meshrl.pool.episode import episode_of, run_episodes
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


def generate_rollouts(engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                      provider: str) -> RolloutFile:
    """Generate, score and prove the rollouts of assignment `a` with the loaded policy (`tasks`
    is `a.rules.task.build()`, built once by the worker)."""
    problems = a.problems(tasks)
    prompts = a.prompt_rows(tokenizer, problems)
    g = a.rules.group_size
    eps = run_episodes(engine, tokenizer, prompts,
                       [episode_of(tasks, problems[prompt_of_row(r, g)])
                        for r in range(len(prompts))], sampling_params(a), a.sampler_seed())
    if any(e.policy_version != a.policy_version for e in eps):  # drawn for a.version
        raise RuntimeError(f"the engine holds policy version {eps[0].policy_version}, the "
                           f"assignment is for version {a.policy_version}")
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
        node=a.node, provider=provider, pool_id=a.rules.pool_id,
        policy_version=a.policy_version, rules_sha256=a.rules.digest(),
        sampling_seed=a.sampler_seed(), toploc_chunk_size=DEFAULT_CHUNK_SIZE,
        toploc_topk=DEFAULT_TOPK, work_units=work_units(rows))
    return RolloutFile(header, rows)
