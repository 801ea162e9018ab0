"""Verifiable tasks and rewards; problem sampling that validators can recompute."""

from __future__ import annotations

from typing import Any

from meshrl.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from meshrl.tasks.base import Problem, Task, TaskError
from meshrl.tasks.code import CodeConfig, CodeTask, extract_program
from meshrl.tasks.dataset import DatasetConfig, DatasetError, DatasetTask, load_rows
from meshrl.tasks.environment import (
    EnvironmentConfig,
    EnvironmentTask,
    VerifiersEnvError,
    VerifiersEpisodeConfig,
)
from meshrl.tasks.gym import GymConfig, GymTask, UnknownGymDataset
from meshrl.tasks.math import MathConfig, MathTask, load_math_rows
from meshrl.tasks.reverse import ReverseConfig, ReverseTextTask
from meshrl.tasks.reward import Reward, length_penalty, task_reward
from meshrl.tasks.sampling import (
    LengthTargetConfig,
    TasksConfig,
    TaskSet,
    compute_reward,
    problem_seed,
    sample_problems,
    sampling_seed,
    task_score_of,
)
from meshrl.tasks.sandbox import (
    SandboxConfig,
    SandboxResult,
    SandboxUnavailable,
    check_sandbox,
    run_sandboxed,
)
from meshrl.tasks.tool_arithmetic import ToolArithmeticConfig, ToolArithmeticTask
from meshrl.tasks.tools import EpisodeConfig, Tool, ToolRefused, ToolResult, ToolSpec, build_tool

__all__ = [
    "TASK_CONFIGS",
    "ArithmeticConfig",
    "ArithmeticTask",
    "CodeConfig",
    "CodeTask",
    "DatasetConfig",
    "DatasetError",
    "DatasetTask",
    "EnvironmentConfig",
    "EnvironmentTask",
    "EpisodeConfig",
    "GymConfig",
    "GymTask",
    "LengthTargetConfig",
    "MathConfig",
    "MathTask",
    "Problem",
    "ReverseConfig",
    "ReverseTextTask",
    "Reward",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailable",
    "Task",
    "TaskError",
    "TaskSet",
    "TasksConfig",
    "Tool",
    "ToolArithmeticConfig",
    "ToolArithmeticTask",
    "ToolRefused",
    "ToolResult",
    "ToolSpec",
    "UnknownGymDataset",
    "VerifiersEnvError",
    "VerifiersEpisodeConfig",
    "build_tool",
    "check_sandbox",
    "compute_reward",
    "extract_program",
    "get_task",
    "length_penalty",
    "load_math_rows",
    "load_rows",
    "problem_seed",
    "run_sandboxed",
    "sample_problems",
    "sampling_seed",
    "task_reward",
    "task_score_of",
]

TASK_CONFIGS: dict[str, type] = {
    "arithmetic": ArithmeticConfig,
    "reverse": ReverseConfig,
    "math": MathConfig,
    "dataset": DatasetConfig,
    "code": CodeConfig,
    "reasoning_gym": GymConfig,
    "verifiers": EnvironmentConfig,
    "tool_arithmetic": ToolArithmeticConfig,
}


def get_task(name: str, **params: Any) -> Task:
    """Build the task `name` with config `params` (validated; unknown params are errors)."""
    if name not in TASK_CONFIGS:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(sorted(TASK_CONFIGS))}")
    return TASK_CONFIGS[name](**params).build()
