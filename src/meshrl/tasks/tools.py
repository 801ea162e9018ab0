"""Tools of agentic episodes that a validator can re-run: deterministic functions of the call
the model wrote and the assignment's seed.

A worker runs a tool on the call it parsed from the model's text and appends the output to
the conversation; a validator re-runs the same tool on the same call and compares the output
byte for byte (`meshrl.pool.episode`). So a tool must give the same output on every machine:
- `calc`: integer arithmetic (+ - * // % ** and parentheses) by its own parser over Python's
  syntax tree (never `eval`), bounded input, exponents and result size;
- `python`: the program in the bubblewrap sandbox (`meshrl.tasks.sandbox`: no network, no
  file system but /usr, bounded CPU, memory, processes and output), with a prelude that seeds
  `random` from the assignment and pins the clock (`time.time`, `time.monotonic`...) to 0.
A tool that cannot be re-run exactly (network access, the wall clock, an LLM judge) is refused
when the task is built, in one line (`ToolRefused`).

A call is written in the tool's tag, `<calc>12*34</calc>`: the closing tag is a stop string,
so generation ends right after the call.
"""

from __future__ import annotations

import ast
from abc import ABC, abstractmethod
from dataclasses import dataclass

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.sandbox import SandboxConfig, SandboxUnavailable, check_sandbox, run_sandboxed

__all__ = [
    "REPLAYABLE",
    "Calculator",
    "EpisodeConfig",
    "PythonTool",
    "Tool",
    "ToolRefused",
    "ToolResult",
    "ToolSpec",
    "build_tool",
]

# exit status of a tool that refused its call (a parse error, a bound): deterministic
EXIT_ERROR = 1
REPLAYABLE = ("calc", "python")
# tools people ask for that no validator can re-run exactly, with the reason
_NOT_REPLAYABLE = {
    "search": "it queries the network", "web": "it queries the network",
    "http": "it queries the network", "browser": "it queries the network",
    "clock": "it reads the wall clock", "time": "it reads the wall clock",
    "judge": "it asks an LLM judge", "llm": "it asks an LLM judge",
}


class ToolRefused(ValueError):
    """A tool no validator can re-run exactly (one line naming why)."""


class ToolSpec(Config):
    """One tool of a task's episodes (published with the task: every party runs the same)."""

    name: str = Field(..., pattern=r"^[a-z][a-z0-9_]{0,31}$", description="the tool, and its "
                      "call tag: <name>call</name>")
    max_call_chars: int = Field(256, ge=1, le=1 << 16, description="longest call run; a "
                                "longer one is an error output")
    max_output_chars: int = Field(256, ge=1, le=1 << 16, description="output kept (the rest "
                                  "cut, deterministically)")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits of the "
                                   "python tool's runs")


@dataclass(frozen=True)
class ToolResult:
    output: str
    exit: int


class Tool(ABC):
    """A deterministic tool: `run(call, seed)` gives the same result on every machine."""

    name: str

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec

    @property
    def open_tag(self) -> str:
        return f"<{self.name}>"

    @property
    def close_tag(self) -> str:
        return f"</{self.name}>"

    def run(self, call: str, seed: int) -> ToolResult:
        if len(call) > self.spec.max_call_chars:
            return ToolResult(f"error: call longer than {self.spec.max_call_chars} characters",
                              EXIT_ERROR)
        res = self._run(call, seed)
        return ToolResult(res.output[: self.spec.max_output_chars], res.exit)

    @abstractmethod
    def _run(self, call: str, seed: int) -> ToolResult: ...


_MAX_DIGITS = 64  # of a calculator's operands and results
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
        ast.Mod: lambda a, b: a % b}


class _CalcError(ValueError):
    pass


class Calculator(Tool):
    """Integer arithmetic over a whitelisted syntax tree: no names, calls or attributes."""

    name = "calc"

    def _run(self, call: str, seed: int) -> ToolResult:
        try:
            tree = ast.parse(call.strip(), mode="eval")
            return ToolResult(str(self._value(tree.body, 0)), 0)
        except (_CalcError, SyntaxError, ValueError, RecursionError, MemoryError,
                ZeroDivisionError) as e:
            why = "division by zero" if isinstance(e, ZeroDivisionError) else (
                str(e) if isinstance(e, _CalcError) else "not an arithmetic expression")
            return ToolResult(f"error: {why}", EXIT_ERROR)

    def _value(self, node: ast.AST, depth: int) -> int:
        if depth > 32:
            raise _CalcError("nested too deep")
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            v = self._value(node.operand, depth + 1)
            out = -v if isinstance(node.op, ast.USub) else v
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            out = _OPS[type(node.op)](self._value(node.left, depth + 1),
                                      self._value(node.right, depth + 1))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base, exp = self._value(node.left, depth + 1), self._value(node.right, depth + 1)
            if not 0 <= exp <= 64:
                raise _CalcError("exponent outside [0, 64]")
            if len(str(abs(base))) * max(exp, 1) > _MAX_DIGITS * 2:
                raise _CalcError(f"result over {_MAX_DIGITS} digits")
            out = base**exp
        else:
            raise _CalcError("only integers, + - * // % ** and parentheses")
        if len(str(abs(out))) > _MAX_DIGITS:
            raise _CalcError(f"result over {_MAX_DIGITS} digits")
        return out


# pins what a program could read that differs between runs: the clock and the seeds
_PRELUDE = """\
import random as _r, time as _t
_r.seed({seed})
for _n in ("time", "monotonic", "perf_counter", "process_time"):
    setattr(_t, _n, lambda: 0.0)
for _n in ("time_ns", "monotonic_ns", "perf_counter_ns", "process_time_ns"):
    setattr(_t, _n, lambda: 0)
del _r, _t, _n
"""


class PythonTool(Tool):
    """A Python program in the bubblewrap sandbox; its stdout is the output, its exit status
    (negative: the signal that killed it, e.g. the CPU or output bound) the status."""

    name = "python"

    def __init__(self, spec: ToolSpec) -> None:
        super().__init__(spec)
        check_sandbox(spec.sandbox)  # a machine that cannot sandbox refuses here, at build

    def _run(self, call: str, seed: int) -> ToolResult:
        res = run_sandboxed(_PRELUDE.format(seed=int(seed)) + call, "", self.spec.sandbox)
        # a run the wall clock ended is a fixed status, whatever it printed by then
        return ToolResult("", 124) if res.timed_out else ToolResult(res.stdout, res.returncode)


def build_tool(spec: ToolSpec) -> Tool:
    """The tool `spec` names, or `ToolRefused` in one line when no validator could re-run it."""
    if spec.name == "calc":
        return Calculator(spec)
    if spec.name == "python":
        try:
            return PythonTool(spec)
        except SandboxUnavailable as e:
            raise ToolRefused(f"tool 'python': {e}") from None
    why = next((w for k, w in _NOT_REPLAYABLE.items() if k in spec.name), None)
    raise ToolRefused(f"tool {spec.name!r} refused: " + (
        f"{why}, so a validator cannot re-run it exactly" if why else
        f"not a tool a validator can re-run (replayable: {', '.join(REPLAYABLE)})"))


class EpisodeConfig(Config):
    """How a task's episodes run: its tools, and the limits every party checks."""

    tools: list[ToolSpec] = Field(default_factory=lambda: [ToolSpec(name="calc")],
                                  min_length=1, max_length=8, description="the tools a call "
                                  "may name (each replayable)")
    max_turns: int = Field(3, ge=1, le=32, description="model segments per episode at most")
    max_tool_tokens: int = Field(24, ge=1, le=4096, description="tokens of one tool output "
                                 "at most (the rest cut); a tool runs only while this many "
                                 "more fit the episode's token budget")
    result_template: str = Field("<result>{output}</result>", description="how a tool's "
                                 "output is written into the conversation")

    def build(self) -> list[Tool]:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"episode: a tool appears twice in {names}")
        return [build_tool(t) for t in self.tools]
