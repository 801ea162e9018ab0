"""The tools of a multi-turn `verifiers` environment, as tools a validator re-runs (issue #45).

verifiers 0.4 declares tools as MCP toolsets: a `vf.Toolset` subclass whose `@vf.tool` methods
its harness serves per rollout (`Task.toolsets`, `Taskset.toolsets`), in a runtime, possibly
with per-rollout state synced over HTTP. meshrl never serves them. A tool is accepted when a
validator can re-run it exactly from the conversation and the assignment's seed:

- **mapped** (`episode.tools`, the environment's tool name onto a `ToolSpec`): meshrl's own
  re-runnable tool (`calc`, `python`, a lookup in a pinned corpus) answers in its place;
- **a plain function**: the method's own source (read from the installed package) runs in
  meshrl's bubblewrap sandbox (`FunctionTool`), with the clock pinned, `random` seeded from
  the assignment, the hash seed fixed and the sandbox's limits, so its output is a function
  of its arguments. Its free names must be builtins, standard-library modules or constants;
  it may not read its toolset (`self`: config, state), the network, the wall clock, files,
  the OS's randomness, or run programs or threads.

Everything else is refused in one line naming the tool and why (`tool_refusal`): a toolset
with per-rollout state (a `vf.State` subclass) or per-task setup, a remote or containerized
server, a server that is not a `vf.Toolset`, a tool whose code does any of the above.

A call is the tool's tag around a JSON object of its arguments, `<mul>{"a": 7, "b": 8}</mul>`
(a bare JSON value for a tool of one argument, `<sq>12</sq>`); the output is the returned
string, or the JSON of any other value; an exception is `error: Type: message` (exit 1).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import textwrap
import types
from typing import Any

from meshrl.tasks.sandbox import run_sandboxed
from meshrl.tasks.tools import _PRELUDE, Tool, ToolResult, ToolSpec

__all__ = ["FunctionTool", "TagOnly", "function_program", "toolset_tools"]

# a tool that reaches for one of these cannot be re-run exactly: the reason, by module
_MODULES = {
    **dict.fromkeys(("socket", "ssl", "urllib", "http", "ftplib", "smtplib", "imaplib",
                     "poplib", "xmlrpc", "requests", "httpx", "aiohttp"),
                    "it reaches the network"),
    **dict.fromkeys(("datetime", "zoneinfo", "calendar"), "it reads the wall clock"),
    **dict.fromkeys(("secrets", "uuid"), "it reads the OS's randomness"),
    **dict.fromkeys(("os", "pathlib", "shutil", "tempfile", "glob", "sqlite3"),
                    "it reads the machine's files or environment"),
    **dict.fromkeys(("subprocess", "multiprocessing", "threading", "concurrent", "signal",
                     "ctypes"), "it runs programs, threads or native code"),
}
_BUILTINS = {"open": "it reads the machine's files", "input": "it reads its stdin",
             "exec": "it runs code it builds", "eval": "it runs code it builds",
             "compile": "it runs code it builds", "__import__": "it imports by name",
             "globals": "it reads its module", "breakpoint": "it opens a debugger",
             "memoryview": "it reads raw memory"}
_CONSTANTS = (int, float, str, bool, bytes, type(None))
_MAX_CONSTANT = 4096  # characters of one inlined constant


class _Refused(Exception):
    pass


def _module_reason(name: str) -> str | None:
    top = name.split(".")[0]
    if top in _MODULES:
        return f"{_MODULES[top]} ({top})"
    if top not in sys.stdlib_module_names:
        return f"it imports {top!r}, not the standard library (the sandbox has only that)"
    return None


def _names(fn: ast.AST) -> tuple[set[str], set[str]]:
    """(names the function reads, names it binds anywhere inside), conservatively."""
    loads, binds = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
        elif isinstance(node, ast.arg):
            binds.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            binds.add(node.name)
        elif isinstance(node, ast.alias):
            binds.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            binds.add(node.name)
    return loads, binds


def function_program(fn: Any) -> tuple[str, int]:
    """(the sandbox program defining `_tool` from `fn`'s own source, with its imports and
    constants, and the parameters a call names) or `_Refused` with why."""
    raw = inspect.unwrap(getattr(fn, "__func__", fn))
    bound = getattr(fn, "__self__", None) is not None
    try:
        src = textwrap.dedent(inspect.getsource(raw))
    except (OSError, TypeError):
        raise _Refused("its source is not available to re-run") from None
    tree = ast.parse(src)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise _Refused("it is not a plain function")
    node.decorator_list = []
    node.name = "_tool"
    params = list(inspect.signature(raw).parameters.values())
    if bound:
        params = params[1:]
        me = node.args.posonlyargs[:1] + node.args.args[:1]
        if me and me[0].arg in _names(ast.Module(node.body, []))[0]:
            raise _Refused(f"it reads its toolset ({me[0].arg}: its config or per-rollout "
                           f"state)")
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import | ast.ImportFrom):
            if isinstance(sub, ast.ImportFrom) and (sub.level or not sub.module):
                raise _Refused("it imports from its own package")
            for name in ([sub.module] if isinstance(sub, ast.ImportFrom) else
                         [a.name for a in sub.names]):
                why = _module_reason(name)
                if why:
                    raise _Refused(why)
        elif isinstance(sub, ast.Global | ast.Nonlocal):
            raise _Refused("it writes state outside its call (global)")
    loads, binds = _names(node)
    lines = []
    for name in sorted(loads - binds):
        if name in _BUILTINS:
            raise _Refused(f"{_BUILTINS[name]} ({name})")
        if name in raw.__globals__:
            value = raw.__globals__[name]
        elif hasattr(builtins, name):
            continue
        elif raw.__closure__ and name in raw.__code__.co_freevars:
            raise _Refused(f"it reads {name!r} from an enclosing function")
        else:
            continue  # a NameError when run: an error output, the same on every machine
        if isinstance(value, types.ModuleType):
            why = _module_reason(value.__name__)
            if why:
                raise _Refused(why)
            lines.append(f"import {value.__name__} as {name}")
        elif type(value) in _CONSTANTS and len(repr(value)) <= _MAX_CONSTANT:
            lines.append(f"{name} = {value!r}")
        else:
            raise _Refused(f"it uses its module's {name!r} (re-run from its own source, a "
                           f"tool may use builtins, standard-library modules and constants)")
    program = "\n".join([*lines, ast.unparse(node), _RUNNER.format(
        first="None, " if bound else "", only=params[0].name if len(params) == 1 else "")])
    return program, len(params)


# runs `_tool` on the call (stdin): its prints are dropped, its value printed
_RUNNER = """
def _main():
    import contextlib, io, json, re, sys
    try:
        args = json.loads(sys.stdin.read())
    except ValueError:
        print("error: the call is not JSON arguments", end="")
        return 1
    if not isinstance(args, dict):
        if not {only!r}:
            print("error: the call is not a JSON object of arguments", end="")
            return 1
        args = {{{only!r}: args}}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            out = _tool({first}**args)
            if hasattr(out, "__await__"):
                import asyncio
                out = asyncio.run(out)
    except Exception as e:  # a fixed message: no addresses
        why = re.sub(r"0x[0-9a-fA-F]+", "0x_", str(e))
        print(f"error: {{type(e).__name__}}: {{why}}" if why else
              f"error: {{type(e).__name__}}", end="")
        return 1
    print(out if isinstance(out, str) else json.dumps(out, default=str), end="")
    return 0


raise SystemExit(_main())
"""


class FunctionTool(Tool):
    """A verifiers `@vf.tool` function re-run from its own source in the bubblewrap sandbox
    (`spec.sandbox`), `random` seeded from the assignment and the clock pinned (the `python`
    tool's prelude). A run the wall clock ended is exit 124 with no output."""

    def __init__(self, spec: ToolSpec, program: str, signature: str, doc: str) -> None:
        super().__init__(spec)
        self.name = spec.name
        self.program = program
        self.signature = signature
        self.doc = doc

    def _run(self, call: str, seed: int) -> ToolResult:
        code = "from __future__ import annotations\n" + _PRELUDE.format(seed=int(seed)) + \
            self.program
        res = run_sandboxed(code, call, self.spec.sandbox)
        return ToolResult("", 124) if res.timed_out else ToolResult(res.stdout, res.returncode)


class TagOnly(Tool):
    """A tool known by its tags only: a task built to score (the scoring child) parses the
    conversation's calls but never runs one."""

    def __init__(self, spec: ToolSpec) -> None:
        super().__init__(spec)
        self.name = spec.name

    def _run(self, call: str, seed: int) -> ToolResult:
        raise RuntimeError("a task built to score runs no tool")


def _toolset_reason(ts: Any) -> str | None:
    """Why no tool of toolset `ts` can be re-run as a function, or None."""
    from verifiers.v1.mcp import Toolset
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.state import State, state_cls

    kind = type(ts)
    if not isinstance(ts, Toolset):
        return (f"it is an MCP server ({kind.__name__}), not a vf.Toolset of @vf.tool "
                f"functions: its tools and their code are known only by serving it")
    cfg = getattr(ts, "config", None)
    if getattr(cfg, "url", None):
        return f"it is a remote MCP server at {cfg.url} (network)"
    runtime = getattr(cfg, "runtime", None)
    if runtime is not None and not isinstance(runtime, SubprocessConfig):
        return f"its server runs in a {type(runtime).__name__} runtime (a container)"
    st = state_cls(kind)
    if st is not State:
        return f"its toolset keeps per-rollout state ({st.__name__})"
    for hook in ("setup", "setup_task", "register"):
        if getattr(kind, hook) is not getattr(Toolset, hook):
            return f"its toolset overrides {hook}() (state or handlers set up per rollout)"
    return None


def toolset_tools(env: str, toolsets: list[Any], mapped: dict[str, ToolSpec],
                  base: ToolSpec) -> list[tuple[str, Any]]:
    """[(the tool's verifiers name, its meshrl spec (mapped) or FunctionTool)] of every tool
    of `toolsets`, or `ValueError` in one line naming the first tool refused and why. `base`:
    the limits and sandbox of function tools."""
    from verifiers.v1.mcp import Toolset
    from verifiers.v1.utils.decorators import discover_decorated

    out: list[tuple[str, Any]] = []
    for ts in toolsets:
        why = _toolset_reason(ts)
        if not isinstance(ts, Toolset):
            raise ValueError(f"verifiers environment {env!r}: toolset {type(ts).__name__!r} "
                             f"refused: {why}, so no validator can re-run its tools exactly")
        server = ts.server_name
        for fn in discover_decorated(ts, "tool"):
            raw = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{server}_{raw}" if server else raw
            if name in mapped:
                out.append((name, mapped[name]))
                continue
            try:
                if why:
                    raise _Refused(why)
                program, _ = function_program(fn)
                spec = ToolSpec.model_validate({**base.model_dump(), "name": name})
            except _Refused as e:
                raise ValueError(f"verifiers environment {env!r}: tool {name!r} refused: {e}, "
                                 f"so no validator can re-run it exactly (map it onto a meshrl "
                                 f"tool: episode.tools, docs/tasks.md)") from None
            except ValueError:
                raise ValueError(f"verifiers environment {env!r}: tool name {name!r} is not a "
                                 f"meshrl call tag ([a-z][a-z0-9_]{{0,31}}; map it onto a "
                                 f"meshrl tool: episode.tools)") from None
            params = list(inspect.signature(fn).parameters)  # bound: without self
            doc = ((fn.__doc__ or "").strip().splitlines() or [""])[0]
            out.append((name, FunctionTool(spec, program, ", ".join(params), doc)))
    return out
