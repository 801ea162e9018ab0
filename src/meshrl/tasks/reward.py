"""Rewards: the task verifier's score plus INTELLECT-2's optional length-target term.

With a length target the prompt asks for about T tokens and the reward becomes
r = r_task - alpha * |T - num_tokens|, so one model learns to respect a thinking budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrl.tasks.base import Problem, Task

__all__ = ["Reward", "length_penalty", "task_reward"]


@dataclass(frozen=True)
class Reward:
    task: float
    length: float
    total: float


def length_penalty(target: int, num_tokens: int, alpha: float) -> float:
    """-alpha * |target - num_tokens| (<= 0)."""
    return -alpha * abs(target - num_tokens)


def task_reward(
    problem: Problem, completion: str, num_tokens: int, task: Task, alpha: float = 0.0
) -> Reward:
    """Score `completion` with `task`; add the length term when the problem carries a target.
    A task whose scorer may hang on untrusted text (`Task.killable`) scores in the killable
    child, past its deadline a 0: worker, validator and trainer all score through here."""
    spec = task.killable()
    if spec is None:
        r_task = float(task.score(problem, completion))
    else:
        from meshrl.tasks.killable import task_score_outcome

        r_task = task_score_outcome(spec[0], problem, completion, spec[1]).score
    target = problem.meta.get("target_length")
    r_len = length_penalty(int(target), num_tokens, alpha) if target is not None else 0.0
    return Reward(task=r_task, length=r_len, total=r_task + r_len)
