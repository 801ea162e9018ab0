"""Tools of agentic episodes that a validator can re-run: deterministic functions of the call
the model wrote and the assignment's seed.

A worker runs a tool on the call it parsed from the model's text and appends the output to
the conversation; a validator re-runs the same tool on the same call and compares the output
byte for byte (`meshrl.pool.episode`). So a tool must give the same output on every machine:
- `calc`: integer arithmetic (+ - * // % ** and parentheses) by its own parser over Python's
  syntax tree (never `eval`), bounded input, exponents and result size;
- `python`: the program in the bubblewrap sandbox (`meshrl.tasks.sandbox`: no network, no
  file system but /usr, bounded CPU, memory, processes and output), with a prelude that seeds
  `random` from the assignment and pins the clock (`time.time`, `time.monotonic`...) to 0;
- a lookup (any tool with a `corpus`): the entries of a fixed JSONL corpus the pool's rules
  name and pin by sha256, found by exact id or by BM25-lite in exact rational arithmetic with
  a fixed tie break (`CorpusLookup`).
A tool that cannot be re-run exactly (network access, the wall clock, an LLM judge) is refused
when the task is built, in one line (`ToolRefused`).

A call is written in the tool's tag, `<calc>12*34</calc>`: the closing tag is a stop string,
so generation ends right after the call.
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.sandbox import SandboxConfig, SandboxUnavailable, check_sandbox, run_sandboxed

__all__ = [
    "REPLAYABLE",
    "Calculator",
    "CorpusLookup",
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
REPLAYABLE = ("calc", "python")  # and a lookup: any name, with a pinned `corpus`
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
    corpus: str = Field("", max_length=4096, description="a lookup tool's corpus: a JSONL file "
                        "of {\"id\": str, \"text\": str} rows (`meshrl:NAME`: a shipped file); "
                        "set, the tool answers each call from it, whatever its name")
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$", description="the corpus file's "
                        "sha256 (meshrl.tasks.dataset.data_digest), required with a corpus: "
                        "a corpus that hashes otherwise is refused")
    top_k: int = Field(1, ge=1, le=8, description="a lookup's output: the texts of its k best "
                       "entries, one a line")


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


_CORPUS_MAX_BYTES = 64 << 20
_CORPUS_MAX_ROWS = 200_000
_ENTRY_MAX_CHARS = 1 << 16
_QUERY_MAX_TERMS = 16
_WORD = re.compile(r"[a-z0-9]+")
# BM25's constants, as exact fractions: every machine ranks the same, to the last bit
_K1, _B = Fraction(6, 5), Fraction(3, 4)


def _terms(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class CorpusLookup(Tool):
    """Lookups in a fixed corpus the pool's rules name and pin (`spec.corpus`, `spec.sha256`):
    a call that is an entry's id (trimmed) is answered with that entry's text; any other call
    is a query, answered with the texts of the `top_k` entries of highest BM25-lite score

        sum over the query's distinct terms t in the entry of
            idf(t) x tf (k1 + 1) / (tf + k1 (1 - b + b |entry| / avg |entry|)),
        idf(t) = (2N + 1) / (2 df(t) + 1)     (a rational idf: no logarithm, no libm)

    in exact fractions (terms: runs of [a-z0-9] of the lower-cased text; k1 = 6/5, b = 3/4),
    ties to the earlier entry; no entry sharing a term is `error: no entry matches` (exit 1).
    Bounded: the corpus at 64 MiB and 200k entries of 64 KiB, a query at 16 distinct terms,
    the output at `max_output_chars`."""

    def __init__(self, spec: ToolSpec) -> None:
        super().__init__(spec)
        self.name = spec.name
        from meshrl.tasks.dataset import data_path

        where = f"tool {spec.name!r}: corpus {spec.corpus}"
        if not spec.sha256:
            raise ToolRefused(f"{where}: no sha256 pin (a corpus is read only when its rule "
                              f"pins its bytes)")
        try:
            path = data_path(spec.corpus)
            if path.stat().st_size > _CORPUS_MAX_BYTES:
                raise ToolRefused(f"{where}: over {_CORPUS_MAX_BYTES >> 20} MiB")
            data = path.read_bytes()
        except OSError as e:
            raise ToolRefused(f"{where}: cannot be read ({e.strerror or e})") from None
        except ValueError as e:  # a malformed meshrl:NAME
            raise ToolRefused(f"{where}: {e}") from None
        import hashlib

        got = hashlib.sha256(data).hexdigest()
        if got != spec.sha256:
            raise ToolRefused(f"{where}: sha256 {got} differs from the rules' pin {spec.sha256}")
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.by_id: dict[str, int] = {}
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.lengths: list[int] = []
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ToolRefused(f"{where}:{n}: invalid JSON ({e.msg})") from None
            if not (isinstance(row, dict) and isinstance(row.get("id"), str)
                    and isinstance(row.get("text"), str)):
                raise ToolRefused(f"{where}:{n}: an entry is {{\"id\": str, \"text\": str}}")
            key, text = row["id"].strip(), row["text"]
            if key in self.by_id or len(text) > _ENTRY_MAX_CHARS or \
                    len(self.ids) >= _CORPUS_MAX_ROWS:
                raise ToolRefused(f"{where}:{n}: " + (
                    f"id {key!r} appears twice" if key in self.by_id else
                    f"text over {_ENTRY_MAX_CHARS} characters" if len(text) > _ENTRY_MAX_CHARS
                    else f"over {_CORPUS_MAX_ROWS} entries"))
            i = len(self.ids)
            self.ids.append(key)
            self.texts.append(text)
            self.by_id[key] = i
            terms = _terms(text)
            self.lengths.append(len(terms))
            counts: dict[str, int] = {}
            for t in terms:
                counts[t] = counts.get(t, 0) + 1
            for t, tf in counts.items():
                self.postings.setdefault(t, []).append((i, tf))
        if not self.ids:
            raise ToolRefused(f"{where}: no entries")
        self.avg = Fraction(sum(self.lengths), len(self.ids)) or Fraction(1)

    def _run(self, call: str, seed: int) -> ToolResult:
        query = call.strip()
        if query in self.by_id:
            return ToolResult(self.texts[self.by_id[query]], 0)
        terms = sorted(set(_terms(query)))
        if len(terms) > _QUERY_MAX_TERMS:
            return ToolResult(f"error: over {_QUERY_MAX_TERMS} distinct terms", EXIT_ERROR)
        n, scores = len(self.ids), {}
        for t in terms:
            hits = self.postings.get(t, [])
            idf = Fraction(2 * n + 1, 2 * len(hits) + 1)
            for i, tf in hits:
                norm = _K1 * (1 - _B + _B * self.lengths[i] / self.avg)
                scores[i] = scores.get(i, 0) + idf * tf * (_K1 + 1) / (tf + norm)
        if not scores:
            return ToolResult("error: no entry matches", EXIT_ERROR)
        best = sorted(scores, key=lambda i: (-scores[i], i))[: self.spec.top_k]
        return ToolResult("\n".join(self.texts[i] for i in best), 0)


def build_tool(spec: ToolSpec) -> Tool:
    """The tool `spec` names, or `ToolRefused` in one line when no validator could re-run it."""
    if spec.corpus:  # a fixed, pinned corpus: re-runnable whatever the tool is called
        return CorpusLookup(spec)
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
        f"not a tool a validator can re-run (replayable: {', '.join(REPLAYABLE)}, or a "
        f"lookup in a pinned corpus)") + (" (a search of a fixed corpus is a lookup: give it "
                                          "a corpus and its sha256)" if "search" in spec.name
                                          else ""))


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
