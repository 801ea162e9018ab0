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
from dataclasses import dataclass
from typing import Any

from meshrl.inference import Completion, InferenceBackend, SamplingParams
from meshrl.tasks import Problem, TasksConfig, compute_reward, sample_problems, sampling_seed
from meshrl.toploc import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK, build_proofs
from meshrl.wire.rollout_file import Completion as Row
from meshrl.wire.rollout_file import RolloutFile, RolloutHeader

__all__ = ["Assignment", "encode_prompt", "generate_rollouts", "work_units"]


@dataclass(frozen=True)
class Assignment:
    """What the work order and the node's counter fix before generation starts."""

    seed: int
    node: str
    pool_id: int
    step: int
    counter: int
    prompts: int
    group_size: int
    sampling: SamplingParams  # max_new_tokens, temperature, top_p (its seed is not used)
    tasks: TasksConfig

    def problems(self) -> list[Problem]:
        return sample_problems(self.tasks.build(), self.seed, self.node, self.step, self.counter,
                               self.prompts)

    def sampler_seed(self) -> int:
        return sampling_seed(self.seed, self.node, self.step, self.counter)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's token ids: BOS (when the tokenizer has one) then the text."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + tokenizer.encode(prompt)


def work_units(rows: list[Row]) -> int:
    """Tokens processed: every prompt token (prefilled) and every completion token (decoded)."""
    return sum(len(r.prompt_tokens) + len(r.completion_tokens) for r in rows)


EditCompletions = Callable[[list[Completion]], list[Completion]]


def generate_rollouts(
    engine: InferenceBackend,
    tokenizer: Any,
    a: Assignment,
    provider: str,
    problems: list[Problem] | None = None,
    sampling: SamplingParams | None = None,
    edit: EditCompletions | None = None,
) -> RolloutFile:
    """Generate, score and prove the rollouts of assignment `a` with the loaded policy.

    `problems`, `sampling` and `edit` (applied to the completions before they are scored and
    proven) exist for cheating workers only; an honest worker passes none of them.
    """
    problems = a.problems() if problems is None else problems
    seed = a.sampler_seed()
    params = (sampling or a.sampling).model_copy(update={"seed": seed,
                                                         "return_hidden_states": True})
    g = a.group_size
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems for _ in range(g)]
    comps = engine.generate(prompts, params, seq_ids=list(range(len(prompts))))
    if edit is not None:
        comps = edit(comps)
    tasks = a.tasks.build()
    rows = []
    for r, c in enumerate(comps):
        reward = compute_reward(problems[r // g], tokenizer.decode(c.token_ids),
                                len(c.token_ids), tasks)
        rows.append(Row(prompt_id=f"{a.step}/{a.counter}/{r // g}", counter=a.counter,
                        sample_index=r % g, seq_id=c.seq_id, prompt_tokens=c.prompt_ids,
                        completion_tokens=c.token_ids, logprobs=c.logprobs,
                        reward=reward.total, finish_reason=c.finish_reason,
                        toploc_proofs=build_proofs(c.hidden_states)))
    header = RolloutHeader(
        node=a.node, provider=provider, pool_id=a.pool_id, step=a.step,
        policy_version=comps[0].policy_version, task=a.tasks.model_dump(mode="json"),
        sampling=sampling_claim(a), sampling_seed=seed, prompt_seed=a.seed,
        toploc_chunk_size=DEFAULT_CHUNK_SIZE, toploc_topk=DEFAULT_TOPK,
        work_units=work_units(rows))
    return RolloutFile(header, rows)


def sampling_claim(a: Assignment) -> dict[str, Any]:
    """The sampling parameters a file declares: the work order's, plus the group size."""
    s = a.sampling
    out = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
           "top_p": s.top_p, "group_size": a.group_size}
    if s.ignore_eos:
        out["ignore_eos"] = True
    return out
