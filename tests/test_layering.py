"""The package layers of ARCHITECTURE.md ("Layering"), kept by an AST walk of every import.

Each module under `src/meshrl` is parsed (never imported); every `import` / `from ... import`
statement, at module level or inside a function, is an edge to the meshrl module it names. A
package may import only the packages of its row in `ALLOWED`; packages marked torch-free never
import torch (directly, or at module level through another meshrl module); and no two modules
import each other through a chain (a cycle), imports under `if TYPE_CHECKING:` included: a
type-only import is still a dependency, and hiding a cycle behind one hides a design that two
modules need each other. Packages that have not landed yet have their rows
already, so they are covered the moment they do; a package without a row fails the test.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "meshrl"

BASE = frozenset({"config", "log", "lazy", "durable", "wire"})
# Packages whose `config` module a supervisor (network, dashboard) may read: the roles.
ROLES = ("rl", "shardcast", "protocol", "discovery", "orchestrator", "worker", "validator")
ALLOWED: dict[str, frozenset[str]] = {
    **{p: BASE for p in BASE},
    "model": frozenset({"config", "log", "lazy", "durable"}),
    "tasks": frozenset({"config", "log", "lazy", "durable"}),
    "shardcast": BASE,
    "protocol": BASE,
    "pool": BASE | {"tasks"},
    "inference": BASE | {"model", "tasks"},
    "toploc": BASE | {"model", "tasks", "inference"},
    "rl": BASE | {"inference", "model", "tasks", "shardcast", "pool"},
    "discovery": BASE | {"protocol", "shardcast", "pool"},
    "orchestrator": BASE | {"protocol", "shardcast", "pool"},
    "worker": BASE | {"model", "inference", "toploc", "tasks", "shardcast", "protocol", "pool"},
    "validator": BASE | {"model", "inference", "toploc", "tasks", "shardcast", "protocol",
                         "pool"},
    "network": BASE | {"pool"},  # plus the roles' config modules, see `allowed`
    "dashboard": BASE,
    # the cheats and the rogue validator wrap the honest roles from outside; no row above names
    # them, so no honest role can import them (test_no_honest_role_imports_the_adversaries)
    "adversaries": BASE | {"model", "inference", "toploc", "tasks", "shardcast", "protocol",
                           "pool", "worker", "validator"},
}
TOP = frozenset({"cli", ""})  # `meshrl.cli` (the command line) and `meshrl/__init__`: anything
TORCH_FREE = frozenset({*BASE, "tasks", "pool", "shardcast", "protocol", "discovery",
                        "orchestrator", "network", "dashboard"})
TORCH = ("torch", "transformers")


@dataclass(frozen=True)
class Import:
    module: str  # importing module, e.g. "meshrl.rl.loop"
    target: str  # imported module: a meshrl module of the tree, or a top-level third-party name
    line: int
    top_level: bool  # executed when the module is imported (not inside a function)
    type_only: bool  # under `if TYPE_CHECKING:`


def module_names(root: Path) -> dict[str, Path]:
    """`meshrl.a.b` -> its file, for every module under `root` (a `meshrl` source directory)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["meshrl", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a module of the tree (or the top-level name)."""
    if not name.startswith("meshrl"):
        return name.split(".")[0]
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


class _Walker(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: dict[str, Path]) -> None:
        self.module, self.modules, self.found = module, modules, []
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0  # > 0 inside a function
        self.type_only = False

    def _add(self, name: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, _resolve(name, self.modules), node.lineno,
                                 self.depth == 0, self.type_only))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:  # `from pkg import submodule` imports the submodule
            full = f"{base}.{alias.name}"
            self._add(full if full in self.modules else base, node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        if not guarded:
            return self.generic_visit(node)
        self.type_only = True
        for stmt in node.body:
            self.visit(stmt)
        self.type_only = False
        for stmt in node.orelse:
            self.visit(stmt)


def collect_imports(root: Path) -> list[Import]:
    modules = module_names(root)
    found: list[Import] = []
    for name, path in modules.items():
        walker = _Walker(name, path.name == "__init__.py", modules)
        walker.visit(ast.parse(path.read_text(), filename=str(path)))
        found.extend(walker.found)
    return found


def package_of(module: str) -> str:
    """`meshrl.rl.loop` -> "rl"; `meshrl.config` -> "config"; `meshrl` -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def allowed(src: str, target: str) -> bool:
    dst = package_of(target)
    if src in TOP or dst == src:
        return True
    if dst == "":  # `meshrl/__init__` holds the version only
        return True
    if src in ("network", "dashboard") and dst in ROLES and target == f"meshrl.{dst}.config":
        return True
    if src == "network" and target == "meshrl.cli":  # its launcher runs role commands in a
        return True  # forked child, the command line a fresh interpreter would run
    return dst in ALLOWED.get(src, frozenset())


def layer_violations(root: Path) -> list[str]:
    """One line per import that crosses a layer, imports torch where it must not, or sits in a
    package without a row in the table."""
    imports = collect_imports(root)
    out = []
    for pkg in sorted({package_of(m) for m in module_names(root)} - TOP - ALLOWED.keys()):
        out.append(f"package meshrl.{pkg} has no row in the layering table")
    for imp in imports:
        src = package_of(imp.module)
        where = f"{imp.module}:{imp.line}"
        if imp.target.startswith("meshrl") and not allowed(src, imp.target):
            out.append(f"{where}: {src} may not import {imp.target}")
        if src in TORCH_FREE and imp.target in TORCH:
            out.append(f"{where}: {src} must stay torch-free, imports {imp.target}")
    out.extend(_torch_at_import(root, imports))
    return out


def _torch_at_import(root: Path, imports: list[Import]) -> list[str]:
    """Torch-free modules that pull torch in at import time through other meshrl modules
    (importing `a.b.c` also runs `a/__init__` and `a/b/__init__`)."""
    edges: dict[str, set[str]] = {m: set() for m in module_names(root)}
    for imp in imports:
        if imp.top_level and not imp.type_only:
            edges[imp.module].add(imp.target)
    for m in list(edges):
        parts = m.split(".")
        edges[m].update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i])
                        in edges)
    out = []
    for m in sorted(edges):
        if package_of(m) not in TORCH_FREE:
            continue
        seen, stack, parent = {m}, [m], {m: ""}
        while stack:
            cur = stack.pop()
            for nxt in edges.get(cur, ()):
                if nxt in TORCH:
                    chain = [cur]
                    while parent[chain[-1]]:
                        chain.append(parent[chain[-1]])
                    out.append(f"{m}: imports {nxt} at import time via "
                               + " <- ".join(chain))
                    stack.clear()
                    break
                if nxt in edges and nxt not in seen:
                    seen.add(nxt)
                    parent[nxt] = cur
                    stack.append(nxt)
    return out


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected groups of >= 2 meshrl modules (every import: deferred and type-only
    ones included)."""
    edges: dict[str, set[str]] = {m: set() for m in module_names(root)}
    for imp in collect_imports(root):
        if imp.target in edges and imp.target != imp.module:
            edges[imp.module].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the tree is small, recursion depth stays low
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


# ------------------------------------------------------------------------------------- the tests
def test_source_tree_keeps_its_layers() -> None:
    assert layer_violations(SRC) == []


def test_source_tree_has_no_import_cycles() -> None:
    assert import_cycles(SRC) == []


def test_walk_sees_the_real_imports() -> None:
    """The walker finds known edges (a checker that finds nothing would pass everything)."""
    edges = {(i.module, i.target) for i in collect_imports(SRC)}
    assert ("meshrl.rl.trainer", "meshrl.rl.packing") in edges  # module level
    assert ("meshrl.rl.loop", "meshrl.model") in edges  # inside a method
    assert ("meshrl.validator.replay", "meshrl.inference.sampling") in edges
    assert ("meshrl.shardcast.client", "meshrl.log") in edges


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "meshrl"
    for rel, text in {"__init__.py": "", "config.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_crossed_imports_fail(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "rl/__init__.py": "",
        "rl/loop.py": "def main():\n    from meshrl.cli import main\n",
        "shardcast/__init__.py": "",
        "shardcast/client.py": "import torch\nfrom meshrl.rl import loop\n",
        "inference/__init__.py": "",
        "inference/engine.py": "from ..rl.loop import main\n",
        "worker/__init__.py": "",
        "worker/node.py": "from meshrl.validator.checks import check\n",
        "validator/__init__.py": "",
        "validator/checks.py": "import meshrl.inference.engine\n",
        "network/__init__.py": "from meshrl.worker import config\nfrom meshrl.worker import node\n",
        "worker/config.py": "",
        "cli.py": "import meshrl.rl.loop\n",
    })
    assert sorted(layer_violations(root)) == sorted([
        "meshrl.rl.loop:2: rl may not import meshrl.cli",
        "meshrl.shardcast.client:1: shardcast must stay torch-free, imports torch",
        "meshrl.shardcast.client:2: shardcast may not import meshrl.rl.loop",
        "meshrl.inference.engine:1: inference may not import meshrl.rl.loop",
        "meshrl.worker.node:1: worker may not import meshrl.validator.checks",
        "meshrl.network:2: network may not import meshrl.worker.node",
        "meshrl.shardcast.client: imports torch at import time via meshrl.shardcast.client",
    ])


def test_torch_through_another_module_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "wire/__init__.py": "",
        "wire/schema.py": "from meshrl.wire import tensors\n",
        "wire/tensors.py": "def f():\n    pass\nfrom meshrl import log\n",
        "log.py": "import torch\n",
    })
    found = layer_violations(root)
    assert "meshrl.log:1: log must stay torch-free, imports torch" in found
    assert ("meshrl.wire.schema: imports torch at import time via meshrl.log <- "
            "meshrl.wire.tensors <- meshrl.wire.schema") in found


def test_unknown_package_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"gateway/__init__.py": ""})
    assert layer_violations(root) == ["package meshrl.gateway has no row in the layering table"]


def test_cycles_are_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "rl/__init__.py": "",
        "rl/a.py": "from meshrl.rl.b import x\n",
        "rl/b.py": "def f():\n    from meshrl.rl import a\n",  # deferred: still a cycle
        "rl/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from meshrl.rl.d import y\n",
        "rl/d.py": "from . import c\n",  # c -> d is type-only: still a cycle
        "rl/e.py": "from meshrl.rl import f\n",
        "rl/f.py": "def g():\n    return 1\n",  # e -> f only: no cycle
    })
    assert import_cycles(root) == [["meshrl.rl.a", "meshrl.rl.b"], ["meshrl.rl.c", "meshrl.rl.d"]]


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_every_row_allows_only_known_packages(pkg: str) -> None:
    assert ALLOWED[pkg] <= ALLOWED.keys()


def test_no_honest_role_imports_the_adversaries() -> None:
    """Only the command line (`meshrl adversary ...`) reaches the cheats and the rogue."""
    assert not [p for p, row in ALLOWED.items() if "adversaries" in row]
    edges = [i for i in collect_imports(SRC) if i.target.startswith("meshrl.adversaries")
             and not i.module.startswith(("meshrl.adversaries", "meshrl.cli"))]
    assert not edges, edges
