"""One unit of work: the assigned prompts of (node, step, counter), generated, scored and proven.

The rules a validator replays (docs/worker.md):
- problems  = `meshrl.tasks.sample_problems(tasks, seed, node, step, counter, prompts)`;
- each prompt is `[bos] + tokenizer.encode(problem.prompt)` and gets `group_size` completions,
  row r = prompt r // group_size, sampled with seq_id r and the seed
  `meshrl.tasks.sampling_seed(seed, node, step, counter)`;
- reward = `compute_reward(problem, tokenizer.decode(completion), len(completion), tasks)`;
- proofs = `meshrl.toploc.build_proofs(final hidden states of the completion)`;
- work units = the tokens processed: sum over rows of len(prompt) + len(completion).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from meshrl.inference import Completion, InferenceBackend, SamplingParams
from meshrl.tasks import Problem, TasksConfig, compute_reward, sample_problems, sampling_seed
from meshrl.toploc import build_proofs

__all__ = ["Assignment", "RolloutBatch", "RolloutRow", "encode_prompt", "generate_rollouts",
           "work_units"]


@dataclass(frozen=True)
class Assignment:
    """What the work order and the node's counter fix before generation starts."""

    seed: int
    node: str
    step: int
    counter: int
    prompts: int
    group_size: int
    sampling: SamplingParams  # max_new_tokens, temperature, top_p (its seed is not used)
    tasks: TasksConfig

    def problems(self) -> list[Problem]:
        return sample_problems(self.tasks, self.seed, self.node, self.step, self.counter,
                               self.prompts)

    def sampler_seed(self) -> int:
        return sampling_seed(self.seed, self.node, self.step, self.counter)


@dataclass
class RolloutRow:
    prompt_index: int
    seq_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    reward: float
    task_reward: float
    proofs: list[bytes]


@dataclass
class RolloutBatch:
    """Everything that goes into one rollout file (the Parquet schema is `meshrl.wire`'s)."""

    node: str
    provider: str
    step: int
    counter: int
    policy_version: int
    seed: int  # the sampler seed actually used
    sampling: SamplingParams
    tasks: TasksConfig
    group_size: int
    rows: list[RolloutRow] = field(default_factory=list)
    work_units: int = 0


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's token ids: BOS (when the tokenizer has one) then the text."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + tokenizer.encode(prompt)


def work_units(rows: list[RolloutRow]) -> int:
    """Tokens processed: every prompt token (prefilled) and every completion token (decoded)."""
    return sum(len(r.prompt_ids) + len(r.token_ids) for r in rows)


EditCompletions = Callable[[list[Completion]], list[Completion]]


def generate_rollouts(
    engine: InferenceBackend,
    tokenizer: Any,
    a: Assignment,
    policy_version: int,
    provider: str = "",
    problems: list[Problem] | None = None,
    sampling: SamplingParams | None = None,
    edit: EditCompletions | None = None,
) -> RolloutBatch:
    """Generate, score and prove the rollouts of assignment `a` with the loaded policy.

    `problems`, `sampling` and `edit` (applied to the completions before they are scored and
    proven) exist for cheating workers only; an honest worker passes none of them.
    """
    problems = a.problems() if problems is None else problems
    seed = a.sampler_seed()
    params = replace_params(sampling or a.sampling, seed)
    g = a.group_size
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems for _ in range(g)]
    comps = engine.generate(prompts, params, seq_ids=list(range(len(prompts))))
    if edit is not None:
        comps = edit(comps)
    tasks = a.tasks.build()
    rows = []
    for r, c in enumerate(comps):
        reward = compute_reward(problems[r // g], tokenizer.decode(c.token_ids),
                                len(c.token_ids), a.tasks, tasks)
        rows.append(RolloutRow(r // g, c.seq_id, c.prompt_ids, c.token_ids, c.logprobs,
                               c.finish_reason, reward.total, reward.task,
                               build_proofs(c.hidden_states)))
    return RolloutBatch(a.node, provider, a.step, a.counter, policy_version, seed, a.sampling,
                        a.tasks, g, rows, work_units(rows))


def replace_params(params: SamplingParams, seed: int) -> SamplingParams:
    """`params` with the sampler seed and hidden states switched on (proofs need them)."""
    return params.model_copy(update={"seed": seed, "return_hidden_states": True})


def with_rows(batch: RolloutBatch, rows: list[RolloutRow]) -> RolloutBatch:
    return replace(batch, rows=rows, work_units=work_units(rows))
