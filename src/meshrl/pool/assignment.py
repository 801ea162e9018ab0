"""The assignment rules: which problems a (node, policy version, counter) gets, how a prompt
is encoded, which prompt row r belongs to, and what a file's header must say. A worker
generates by them and a validator recomputes them, so each exists once, here.

A file has no step of its own: it is generated with one policy version, and that version's
counters are the only work it offers (issue #44: a `step` beside the version was always equal
to it). The version takes the step's place in the task sampler's inputs, so the problems and
seeds are those a file of step = version always had.

- the counters of a node at a version are 0 .. files_per_step - 1 (`counter_refusal`), each
  granted one file by the orchestrator: nothing to grind, nothing to skip to;
- problems  = `meshrl.tasks.sample_problems(tasks, seed, node, version, counter,
  prompts_per_file, version)`: the policy version is part of the work, so one generation
  serves one claim only;
- each prompt is `[bos] + tokenizer.encode(problem.prompt)`, or the chat template's user turn
  when the rules' `prompt_format` says so (`encode_prompt`), and gets
  `group_size` rows: row r belongs to prompt r // group_size, is sample r % group_size, and is
  sampled with seq_id r and the seed `meshrl.tasks.sampling_seed(seed, node, version, counter,
  version)`;
- reward = `compute_reward(problem, tokenizer.decode(completion), len(completion), tasks)`;
- work units = the tokens processed: sum over rows of len(prompt) + len(completion);
- the header names the rules by their digest (`PoolRules.digest`) and the sampler's seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshrl.pool.rules import PoolRules, PromptFormat
from meshrl.tasks import Problem, TaskSet, sample_problems, sampling_seed

__all__ = ["Assignment", "PromptFormatError", "counter_refusal", "encode_prompt", "prompt_of_row",
           "uses_chat", "work_units"]


class PromptFormatError(ValueError):
    """A pool's `prompt_format` that the policy's tokenizer cannot follow (chat without a
    chat template)."""


def uses_chat(tokenizer: Any, prompt_format: PromptFormat) -> bool:
    """Whether prompts go through the tokenizer's chat template under `prompt_format`, or a
    `PromptFormatError` when the rule asks for a template the tokenizer lacks."""
    has = bool(getattr(tokenizer, "has_chat_template", False))
    if prompt_format == "chat" and not has:
        raise PromptFormatError("prompt_format 'chat': the policy's tokenizer has no chat "
                                "template")
    return has and prompt_format != "raw"


def encode_prompt(tokenizer: Any, text: str, prompt_format: PromptFormat = "raw") -> list[int]:
    """A prompt's token ids: BOS (when the tokenizer has one) then the text, or, when the
    pool's `prompt_format` says so (`uses_chat`), the text as the user turn of the tokenizer's
    chat template up to the assistant's turn (the template writes any BOS itself)."""
    if uses_chat(tokenizer, prompt_format):
        return list(tokenizer.encode(tokenizer.chat_prompt(text)))
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + list(tokenizer.encode(text))


def prompt_of_row(row: int, group_size: int) -> int:
    """The index of the prompt that row `row` of a file answers."""
    return row // group_size


def work_units(prompt_lens: Sequence[int], completion_lens: Sequence[int]) -> int:
    """Tokens processed: every prompt token (prefilled) and every completion token (decoded)."""
    return sum(prompt_lens) + sum(completion_lens)


def counter_refusal(rules: PoolRules, counter: int) -> str | None:
    """Why `counter` is not one a node may use at a policy version (None: it may)."""
    if not 0 <= counter < rules.files_per_step:
        return (f"counter {counter} is outside 0..{rules.files_per_step - 1} "
                f"(files_per_step {rules.files_per_step})")
    return None


@dataclass(frozen=True)
class Assignment:
    """One unit of work: the rules, and the (node, counter, policy version) they are applied
    to."""

    rules: PoolRules
    node: str
    counter: int
    policy_version: int

    def problems(self, tasks: TaskSet) -> list[Problem]:
        """The problems assigned (`tasks` is `rules.task.build()`, built once by the role)."""
        v = self.policy_version  # in the sampler's step place too (module docstring)
        return sample_problems(tasks, self.rules.seed, self.node, v, self.counter,
                               self.rules.prompts_per_file, v)

    def sampler_seed(self) -> int:
        v = self.policy_version
        return sampling_seed(self.rules.seed, self.node, v, self.counter, v)

    def prompt_rows(self, tokenizer: Any, problems: Sequence[Problem]) -> list[list[int]]:
        """The prompt of every row: each problem's encoded prompt, `group_size` times."""
        g = self.rules.group_size
        fmt = self.rules.prompt_format
        return [encode_prompt(tokenizer, p.prompt, fmt) for p in problems for _ in range(g)]

    def prompt_id(self, row: int) -> str:
        """`version/counter/prompt` (the version where a file's step stood: the same text)."""
        return f"{self.policy_version}/{self.counter}/{prompt_of_row(row, self.rules.group_size)}"
