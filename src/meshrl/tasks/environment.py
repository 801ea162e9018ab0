"""A `verifiers` environment (PyPI `verifiers` >= 0.4, its `verifiers.v1` stack) as a task:
its taskset's tasks are the problems, its tasks' `@vf.reward` functions the score.

A single-turn environment: the model's one reply is the completion, scored offline (no
runtime, no harness). A multi-turn environment, one with tools (`Task.toolsets`,
`Taskset.toolsets`), runs meshrl's agentic episodes (`meshrl.pool.episode`) when every tool
meets the re-run rule: a validator re-runs it exactly from the conversation and the
assignment's seed (`meshrl.tasks.vf_tools`): either it is mapped onto one of meshrl's
re-runnable tools (`episode.tools`), or it is a plain `@vf.tool` function of a stateless
toolset that meshrl re-runs from its own source in the bubblewrap sandbox (clock pinned,
`random` seeded, hash seed fixed, bounded). The worker's episode loop calls it by meshrl's
call tags, stop strings and limits; a validator re-runs every call and compares the output
token for token; the reward is the environment's `@vf.reward` functions on the final
conversation (its assistant and tool messages, the reply after the last tool output).

An environment is refused at build, with one line naming why, when it needs what a worker
and a validator cannot both reproduce offline: an LLM judge (network), a container, a reward
that needs a runtime, or a tool no validator can re-run (per-rollout state, a remote or
containerized MCP server, network, the wall clock, files: the line names the tool).

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
from meshrl.tasks.sandbox import SandboxConfig, SandboxUnavailable, check_sandbox
from meshrl.tasks.tools import Tool, ToolRefused, ToolSpec, build_tool

__all__ = ["EnvironmentConfig", "EnvironmentTask", "VerifiersEnvError", "VerifiersEpisodeConfig"]


class VerifiersEnvError(TaskError):
    """A verifiers environment that cannot serve as a task (not installed, needs network, a
    container, a runtime or a tool no validator can re-run)."""


class VerifiersEpisodeConfig(Config):
    """How a multi-turn environment's episodes run (unused by a single-turn one): its tools'
    limits, and the tools meshrl serves in place of the environment's."""

    tools: dict[str, ToolSpec] = Field(default_factory=dict, max_length=8, description="the "
                                       "environment's tool (its verifiers name, e.g. "
                                       "'search_query') -> a meshrl tool answering in its "
                                       "place (calc, python, a lookup in a pinned corpus), "
                                       "called by its own tag")
    max_turns: int = Field(3, ge=1, le=32, description="model segments per episode at most")
    max_tool_tokens: int = Field(24, ge=1, le=4096, description="tokens of one tool output "
                                 "at most (the rest cut)")
    result_template: str = Field("<result>{output}</result>", description="how a tool's "
                                 "output is written into the conversation")
    max_call_chars: int = Field(256, ge=1, le=1 << 16, description="longest call a function "
                                "tool runs; a longer one is an error output")
    max_output_chars: int = Field(256, ge=1, le=1 << 16, description="function tool output "
                                  "kept (the rest cut)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits of a "
                                   "function tool's runs")


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
    episode: VerifiersEpisodeConfig = Field(default_factory=VerifiersEpisodeConfig,
                                            description="episodes of an environment with tools")

    def build(self) -> EnvironmentTask:
        return EnvironmentTask(self)


def _load(cfg: EnvironmentConfig) -> tuple[list[Any], list[Any]]:
    """(the taskset's tasks, its taskset-wide toolsets)."""
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
    items = list(itertools.islice(iter(load_taskset(ts_cfg)), cfg.max_tasks))
    return items, list(taskset_class(cfg.env).toolsets(ts_cfg))


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
    rewards = task.hooks("reward")
    if not rewards:
        return f"verifiers environment {env!r} has no reward function"
    runtime = [fn.__name__ for fn in rewards if _needs_runtime(fn)]
    if runtime:
        return (f"verifiers environment {env!r}: rewards {runtime} need a runtime; only "
                f"offline rewards are supported")
    return None


class EnvironmentTask(RowsTask):
    """The tasks of an installed verifiers environment: one reply each, or episodes with the
    environment's tools when it has any (`episode`, `tools`)."""

    def __init__(self, cfg: EnvironmentConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name or f"vf/{cfg.env}"
        self.items, shared = _load(cfg)
        if not self.items:
            raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: its taskset is empty")
        for task in self.items[:1] + self.items[-1:]:
            why = _refusal(cfg.env, task)
            if why:
                raise VerifiersEnvError(why)
        tools = self._tools(shared)
        if tools:
            self.tools: list[Tool] = tools
            self.episode = cfg.episode
        self.split_rows(len(self.items), cfg.heldout_fraction)

    def _tools(self, shared: list[Any]) -> list[Tool]:
        """The environment's tools as meshrl tools (none: single-turn), or the one-line
        refusal of the first tool no validator can re-run."""
        from meshrl.tasks import base as task_base
        from meshrl.tasks.vf_tools import FunctionTool, TagOnly, toolset_tools

        cfg, ep, score_only = self.cfg, self.cfg.episode, task_base.SCORING_ONLY
        base = ToolSpec(name="tool", max_call_chars=ep.max_call_chars,
                        max_output_chars=ep.max_output_chars, sandbox=ep.sandbox)
        found = []
        for task in self.items[:1] + self.items[-1:]:
            try:
                found.append(toolset_tools(cfg.env, shared + type(task).toolsets(task.config),
                                           ep.tools, base))
            except ValueError as e:
                raise VerifiersEnvError(str(e)) from None
        if [n for n, _ in found[0]] != [n for n, _ in found[-1]]:
            raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: its tasks declare "
                                    f"different tools; a task's tools are the rules' own")
        names = [n for n, _ in found[0]]
        unknown = sorted(set(ep.tools) - set(names))
        if unknown:
            raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: episode.tools maps "
                                    f"{unknown}, which it does not have (its tools: {names})")
        tools: list[Tool] = []
        for _, t in found[0]:
            if score_only:  # the scoring child: tags to parse by, no tool run
                tools.append(TagOnly(t.spec if isinstance(t, FunctionTool) else t))
            elif isinstance(t, FunctionTool):
                tools.append(t)
            else:
                try:
                    tools.append(build_tool(t))
                except ToolRefused as e:
                    raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: {e}") from None
        tags = [t.name for t in tools]
        if len(set(tags)) != len(tags):
            raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: two tools share a call "
                                    f"tag in {tags}")
        if not score_only and any(isinstance(t, FunctionTool) for t in tools):
            try:  # a machine that cannot sandbox refuses here, not at every call
                check_sandbox(ep.sandbox)
            except SandboxUnavailable as e:
                raise VerifiersEnvError(f"verifiers environment {cfg.env!r}: its tools run in "
                                        f"the sandbox: {e}") from None
        return tools

    def tool_lines(self) -> str:
        """How the prompt's `{tools}` describes the tools: a call's shape each, one a line."""
        from meshrl.tasks.vf_tools import FunctionTool

        lines = []
        for t in self.tools or []:
            if isinstance(t, FunctionTool):
                lines.append(f"{t.open_tag}{{JSON arguments: {t.signature}}}{t.close_tag}"
                             + (f" {t.doc}" if t.doc else ""))
            else:
                lines.append(f"{t.open_tag}...{t.close_tag}")
        return "\n".join(lines)

    def problem_at(self, index: int) -> Problem:
        data = self.items[index].data
        text = data.prompt_text
        if data.system_prompt:
            text = f"{data.system_prompt}\n\n{text}"
        answer = getattr(data, "answer", "")
        return Problem(self.name, self.cfg.template.format(prompt=text, tools=self.tool_lines()),
                       str(answer), {"index": index})

    def killable(self) -> tuple[dict[str, Any], float]:
        # the environment's reward functions parse the worker's text (pinned code, but code
        # that may hang or blow up memory on a crafted reply)
        return self.cfg.model_dump(mode="json"), self.cfg.timeout_s

    def score(self, problem: Problem, completion: str) -> float:
        import verifiers.v1 as vf

        task = self.items[int(problem.meta["index"])]
        trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data),
                         agent=vf.AgentInfo(config=vf.AgentConfig()))
        if self.episode is not None:
            trace.nodes, trace.root_reply = _conversation(self, completion)
        else:
            trace.root_reply = completion
        try:
            _run(task.score(trace))
            value = float(trace.reward)
        except Exception:  # a reward function failing on a hostile completion scores 0
            return 0.0
        return min(1.0, max(0.0, value)) if value == value else 0.0


def _conversation(task: EnvironmentTask, completion: str) -> tuple[list[Any], str]:
    """(the episode's messages, as verifiers' trace nodes: each model turn an assistant
    message with its call, each tool output a tool message; the reply after the last tool
    output) parsed from the completion's text by the task's call tags and result template."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.types import AssistantMessage, ToolCall, ToolMessage

    before, _, after = task.episode.result_template.partition("{output}")
    nodes: list[Any] = []
    rest = completion
    while True:
        # the first call, as `meshrl.pool.episode.find_call` finds it: the closing tag first
        hits = [(i, t) for t in task.tools if (i := rest.find(t.close_tag)) >= 0]
        if not hits:
            break
        i, tool = min(hits, key=lambda h: h[0])
        j = rest.rfind(tool.open_tag, 0, i)
        text = rest[j + len(tool.open_tag):i] if j >= 0 else ""
        end = i + len(tool.close_tag)
        out = rest[end:]
        if not out.startswith(before):
            break
        stop = out.find(after, len(before)) if after else len(out)
        if stop < 0:
            break
        k = len(nodes)
        nodes.append(MessageNode(parent=k - 1 if k else None, sampled=True, timestamp=0.0,
                                 message=AssistantMessage(content=rest[:end], tool_calls=[
                                     ToolCall(id=f"call_{k}", name=tool.name,
                                              arguments=text)])))
        nodes.append(MessageNode(parent=k, timestamp=0.0, message=ToolMessage(
            tool_call_id=f"call_{k}", name=tool.name, content=out[len(before):stop])))
        rest = out[stop + len(after):]
    nodes.append(MessageNode(parent=len(nodes) - 1 if nodes else None, sampled=True,
                             timestamp=0.0, message=AssistantMessage(content=rest)))
    return nodes, rest


def _run(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
