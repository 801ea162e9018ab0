"""A `verifiers` environment (PyPI `verifiers` >= 0.4, its `verifiers.v1` stack) as a task:
its taskset's tasks are the problems, its tasks' `@vf.reward` functions the score.

Only single-turn environments: the model's one reply is the completion, scored offline (no
runtime, no harness). An environment is refused at build, with one line naming why, when it
needs what a worker and a validator cannot both reproduce offline: an LLM judge (network),
a container, tools (multi-turn: verifiers' tools are MCP toolsets that the environment's
harness serves per rollout, with state and any code, so no validator can re-run a tool's
output exactly from the conversation), or a reward that needs a runtime. Multi-turn
environments are out of scope.

The taskset is loaded once (at most `max_tasks` tasks, for infinite tasksets) in its own
order, so a problem is an index into a fixed list and a validator that loads the same installed
package with the same config regenerates the worker's problems. The environment's reward code
runs in-process: it is code the operator installed, not code a peer sent (pin its version).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
from typing import Any, Literal

from pydantic import Field, ValidationError

from meshrl.config import Config
from meshrl.tasks.base import Problem, RowsTask, TaskError

__all__ = ["EnvironmentConfig", "EnvironmentTask", "VerifiersEnvError"]


class VerifiersEnvError(TaskError):
    """A verifiers environment that cannot serve as a task (not installed, needs network, a
    container, tools or a runtime)."""


class EnvironmentConfig(Config):
    type: Literal["verifiers"] = "verifiers"
    name: str | None = Field(None, min_length=1, max_length=64, description="the task's name "
                             "in the mix (default: vf/<env>)")
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    env: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$", description="installed "
                     "taskset package id (the top-level module verifiers imports, e.g. "
                     "'my_env')")
    config: dict[str, Any] = Field(default_factory=dict, description="the taskset's own "
                                   "config fields")
    max_tasks: int = Field(100_000, ge=1, le=10_000_000, description="tasks loaded at most")
    heldout_fraction: float = Field(0.1, ge=0, lt=1, description="tasks kept for evaluation")
    template: str = Field("{prompt}", description="prompt template over the task's prompt text "
                          "(system prompt first, when it has one)")
    timeout_s: float = Field(5.0, gt=0, le=600, description="deadline of one answer's score "
                             "(scored in a child killed past it; an answer not scored in time "
                             "scores 0)")

    def build(self) -> EnvironmentTask:
        return EnvironmentTask(self)


def _load(cfg: EnvironmentConfig) -> list[Any]:
    try:
        from verifiers.v1.utils.loaders import load_taskset, taskset_class, taskset_config_type
    except ImportError:
        raise VerifiersEnvError("verifiers task: the verifiers package is not installed (pip "
                               "install 'meshrl[verifiers]')") from None
    try:
        taskset_class(cfg.env)
    except ModuleNotFoundError:
        raise VerifiersEnvError(f"verifiers environment {cfg.env!r} is not installed (no module "
                               f"{cfg.env.replace('-', '_')!r})") from None
    except (AttributeError, TypeError, ValueError) as e:
        raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: {e}") from None
    try:
        ts_cfg = taskset_config_type(cfg.env).model_validate({**cfg.config, "id": cfg.env})
    except ValidationError as e:  # the first error, on one line
        err = e.errors()[0]
        where = ".".join(map(str, err["loc"])) or "config"
        raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: bad config: {where}: "
                               f"{err['msg']}") from None
    return list(itertools.islice(iter(load_taskset(ts_cfg)), cfg.max_tasks))


def _needs_runtime(fn: Any) -> bool:
    p = inspect.signature(fn).parameters.get("runtime")
    return p is not None and p.default is inspect.Parameter.empty


def _refusal(env: str, task: Any) -> str | None:
    kind = type(task)
    if task.config.judges:
        return (f"verifiers environment {env!r} scores with an LLM judge (needs network); "
                f"only offline rewards are supported")
    if getattr(kind, "NEEDS_CONTAINER", False):
        return f"verifiers environment {env!r} needs a container; not supported"
    toolsets = kind.toolsets(task.config)
    if toolsets:
        names = [type(t).__name__ for t in toolsets]
        return (f"verifiers environment {env!r} is multi-turn with tools {names}: MCP "
                f"toolsets its harness serves per rollout (a server with state, running any "
                f"code), which no validator can re-run exactly from the conversation; only "
                f"single-turn environments are tasks (tools a validator re-runs: "
                f"docs/tasks.md, Agentic episodes)")
    rewards = task.hooks("reward")
    if not rewards:
        return f"verifiers environment {env!r} has no reward function"
    runtime = [fn.__name__ for fn in rewards if _needs_runtime(fn)]
    if runtime:
        return (f"verifiers environment {env!r}: rewards {runtime} need a runtime; only "
                f"offline rewards are supported")
    return None


class EnvironmentTask(RowsTask):
    """The tasks of an installed single-turn verifiers environment."""

    def __init__(self, cfg: EnvironmentConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name or f"vf/{cfg.env}"
        self.items = _load(cfg)
        if not self.items:
            raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: its taskset is empty")
        for task in self.items[:1] + self.items[-1:]:
            why = _refusal(cfg.env, task)
            if why:
                raise VerifiersEnvError(why)
        self.split_rows(len(self.items), cfg.heldout_fraction)

    def problem_at(self, index: int) -> Problem:
        data = self.items[index].data
        text = data.prompt_text
        if data.system_prompt:
            text = f"{data.system_prompt}\n\n{text}"
        answer = getattr(data, "answer", "")
        return Problem(self.name, self.cfg.template.format(prompt=text), str(answer),
                       {"index": index})

    def killable(self) -> tuple[dict[str, Any], float]:
        # the environment's reward functions parse the worker's text (pinned code, but code
        # that may hang or blow up memory on a crafted reply)
        return self.cfg.model_dump(mode="json"), self.cfg.timeout_s

    def score(self, problem: Problem, completion: str) -> float:
        import verifiers.v1 as vf

        task = self.items[int(problem.meta["index"])]
        trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data),
                         agent=vf.AgentInfo(config=vf.AgentConfig()), root_reply=completion)
        try:
            _run(task.score(trace))
            value = float(trace.reward)
        except Exception:  # a reward function failing on a hostile completion scores 0
            return 0.0
        return min(1.0, max(0.0, value)) if value == value else 0.0


def _run(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
