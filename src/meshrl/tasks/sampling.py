"""Which problems a node must answer: a pure function of (seed, node id, step, counter).

A worker cannot choose easy prompts: a validator recomputes `sample_problems` from the same
inputs and checks that the rollout file holds exactly those prompts.

Tasks are built once per run: `TasksConfig.build()` returns a `TaskSet` (a `math` task reads its
data file there, once), and `sample_problems` / `compute_reward` take only a `TaskSet`, never a
config, so nothing can rebuild the tasks per call.
"""

from __future__ import annotations

import hashlib
import random
from typing import Annotated

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.arithmetic import ArithmeticConfig
from meshrl.tasks.base import Problem, Task, TaskError
from meshrl.tasks.code import CodeConfig
from meshrl.tasks.dataset import DatasetConfig
from meshrl.tasks.environment import EnvironmentConfig
from meshrl.tasks.gym import GymConfig
from meshrl.tasks.math import MathConfig
from meshrl.tasks.reverse import ReverseConfig
from meshrl.tasks.reward import Reward, length_penalty, task_reward
from meshrl.tasks.tool_arithmetic import ToolArithmeticConfig

__all__ = [
    "LengthTargetConfig",
    "TaskSet",
    "TaskSpec",
    "TasksConfig",
    "compute_reward",
    "problem_seed",
    "sample_problems",
    "sampling_seed",
    "task_score_of",
]

TaskSpec = Annotated[
    ArithmeticConfig | ReverseConfig | MathConfig | DatasetConfig | CodeConfig | GymConfig
    | EnvironmentConfig | ToolArithmeticConfig,
    Field(discriminator="type"),
]


class LengthTargetConfig(Config):
    enabled: bool = Field(False, description="ask for a target length and reward matching it")
    targets: list[int] = Field([8, 16, 32], description="target lengths (tokens) to draw from")
    alpha: float = Field(0.001, ge=0, description="penalty per token of |target - length|")
    template: str = Field(" Answer in about {target} tokens.", description="appended to prompts")


class TasksConfig(Config):
    mix: list[TaskSpec] = Field(
        default_factory=lambda: [ArithmeticConfig()], description="tasks and their weights"
    )
    length_target: LengthTargetConfig = LengthTargetConfig()

    def build(self) -> TaskSet:
        """The run's tasks, built once (data files are read here)."""
        return TaskSet(self)


class TaskSet:
    """The built tasks of one mix: what `sample_problems` and `compute_reward` draw from."""

    def __init__(self, cfg: TasksConfig) -> None:
        self.cfg = cfg
        self.tasks: dict[str, Task] = {}
        for spec in cfg.mix:
            task = spec.build()
            if task.name in self.tasks:
                raise TaskError(f"tasks: {task.name!r} appears twice in the mix")
            self.tasks[task.name] = task
        if any(t.scores_in_child() for t in self.tasks.values()):
            # untrusted answers are scored in the sandboxed child: no sandbox, refuse now
            from meshrl.tasks.killable import check_scoring_sandbox

            check_scoring_sandbox()
        self.names = list(self.tasks)  # a task's name: its type, or its own `name`
        self.weights = [spec.weight for spec in cfg.mix]


def _check(tasks: object) -> TaskSet:
    if not isinstance(tasks, TaskSet):
        raise TypeError(f"expected a TaskSet (TasksConfig.build(), once per run), got "
                        f"{type(tasks).__name__}")
    return tasks


def _seed(tag: str, seed: int, node_id: str, step: int, counter: int,
          version: int | None) -> int:
    node = node_id.lower()  # addresses are case-insensitive hex
    # with a policy version (a pool's work), v2 binds it: one generation serves one claim only
    key = (f"meshrl/v1{tag}|{seed}|{node}|{step}|{counter}" if version is None
           else f"meshrl/v2{tag}|{seed}|{node}|{step}|{counter}|{version}")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def problem_seed(seed: int, node_id: str, step: int, counter: int,
                 version: int | None = None) -> int:
    """A 64-bit seed from (seed, node id, step, counter[, policy version]), stable across
    machines and releases."""
    return _seed("", seed, node_id, step, counter, version)


def sampling_seed(seed: int, node_id: str, step: int, counter: int,
                  version: int | None = None) -> int:
    """The seed of the replayable sampler for the rollouts of (node, step, counter[, version]).

    Distinct from `problem_seed` (another domain tag), so knowing the problems says nothing about
    the sampling noise; a validator recomputes it from the same public inputs.
    """
    return _seed("/sampling", seed, node_id, step, counter, version)


def sample_problems(
    tasks: TaskSet, seed: int, node_id: str, step: int, counter: int, n: int,
    version: int | None = None, heldout: bool = False,
) -> list[Problem]:
    """The `n` problems assigned to (node, step, counter[, policy version]). Pure: same inputs,
    same problems. `heldout`: evaluation problems (`Task.sample_heldout`) instead."""
    tasks = _check(tasks)
    rng = random.Random(problem_seed(seed, node_id, step, counter, version))
    lt = tasks.cfg.length_target
    out = []
    for _ in range(n):
        task = tasks.tasks[rng.choices(tasks.names, tasks.weights)[0]]
        problem = task.sample_heldout(rng) if heldout else task.sample(rng)
        if lt.enabled:
            target = rng.choice(lt.targets)
            problem = Problem(
                problem.task,
                problem.prompt + lt.template.format(target=target),
                problem.answer,
                {**problem.meta, "target_length": target},
            )
        out.append(problem)
    return out


def task_score_of(problem: Problem, reward: float, num_tokens: int, tasks: TaskSet) -> float:
    """The task's score inside a `reward` that `compute_reward` gave (its length term taken
    back out), without running the scorer again: the trainer's accuracy metric reads it from
    rows whose rewards the validator recomputed (rounded to 6 places: rewards travel as
    float32)."""
    lt = _check(tasks).cfg.length_target
    target = problem.meta.get("target_length")
    r_len = length_penalty(int(target), num_tokens, lt.alpha) if (
        lt.enabled and target is not None) else 0.0
    return round(reward - r_len, 6)


def compute_reward(problem: Problem, completion: str, num_tokens: int, tasks: TaskSet) -> Reward:
    """Reward of `completion` for `problem` under this task mix (length term if enabled)."""
    tasks = _check(tasks)
    if problem.task not in tasks.tasks:
        raise KeyError(f"problem of unknown task {problem.task!r}")
    lt = tasks.cfg.length_target
    alpha = lt.alpha if lt.enabled else 0.0
    return task_reward(problem, completion, num_tokens, tasks.tasks[problem.task], alpha)
