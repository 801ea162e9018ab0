"""No module decides what to do about a refusal from its HTTP status number where the wire has
a class for it: callers branch on the type (`NotInPool`, `NoInvite`, ...) or its family
(`Transient`, `NotAuthorized`, `NotFound`, `Refused` in `meshrl.wire.errors`), as httpx groups
its exceptions, so "is this worth retrying?" has one answer.

Every module under `src/meshrl` is parsed (never imported). An exception variable is a name
bound by `except ... as name` or a parameter annotated with an exception class; a finding is a
comparison of its `.status` with a number (or a tuple / list / set of numbers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from meshrl.wire import errors as wire_errors

SRC = Path(__file__).resolve().parents[1] / "src" / "meshrl"

# (module, function): why a status number is the only thing to branch on there
ALLOWED = {
    ("meshrl.shardcast.client", "_is_refusal"):
        "a shard server answers plain HTTP (no codes): its status is all a TransferError has",
    ("meshrl.shardcast.client", "_refused"): "the same TransferError: 403 relays-only, 503 busy",
    ("meshrl.shardcast.tracker", "_watch"): "the same TransferError: 404 version dropped",
    ("meshrl.wire.service", "_json_errors"):
        "the boundary itself: aiohttp's own HTTPException, turned into a code here",
}


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_number(e) for e in node.elts)
    return False


def _annotation_names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node else set()


def _exception_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return {a.arg for a in args
            if any(n.endswith(("Error", "Exception")) for n in _annotation_names(a.annotation))}


def _status_of(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "status"
            and isinstance(node.value, ast.Name) and node.value.id in names)


def status_branches(source: str, module: str) -> list[tuple[str, int, str]]:
    """(function, line, code) of every comparison of an exception's `.status` with numbers."""
    found = []

    def visit(node: ast.AST, function: str, names: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, names = node.name, names | _exception_params(node)
        if isinstance(node, ast.ExceptHandler) and node.name:
            names = names | {node.name}
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if (any(_status_of(s, names) for s in sides) and any(_is_number(s) for s in sides)
                    and (module, function) not in ALLOWED):
                found.append((function, node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, function, names)

    visit(ast.parse(source), "<module>", set())
    return found


def test_no_module_branches_on_a_refusals_status_number() -> None:
    findings = []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        findings += [f"{module}:{line} ({fn}): {code}"
                     for fn, line, code in status_branches(path.read_text(), module)]
    assert not findings, "branch on the refusal's class or family:\n" + "\n".join(findings)


@pytest.mark.parametrize("code, bad", [
    ("try:\n    f()\nexcept WireHTTPError as e:\n    if e.status == 403:\n        pass\n", True),
    ("try:\n    f()\nexcept WireHTTPError as e:\n    if e.status in (403, 429):\n"
     "        pass\n", True),
    ("def t(e: BaseException) -> bool:\n    return e.status >= 500\n", True),
    ("try:\n    f()\nexcept WireHTTPError as e:\n    if isinstance(e, NotInPool):\n"
     "        pass\n", False),
    ("def t(r) -> bool:\n    return r.status != 200\n", False),  # a response, not an error
])
def test_the_rule_finds_status_branches(code: str, bad: bool) -> None:
    assert bool(status_branches(code, "m")) is bad


def test_every_code_class_is_in_the_family_its_status_says() -> None:
    families = (wire_errors.Transient, wire_errors.NotAuthorized, wire_errors.NotFound,
                wire_errors.Refused)
    for code, cls in wire_errors.refusal_classes().items():
        (family,) = [f for f in families if issubclass(cls, f)]
        assert family is wire_errors.family_of(code.status), cls
    assert set(wire_errors.refusal_classes()) == set(wire_errors.ErrorCode)
    # a code this version does not know is placed by its status
    assert type(wire_errors.refusal(429, "newer_limit")) is wire_errors.Transient
    assert type(wire_errors.refusal(403, "newer_rule")) is wire_errors.NotAuthorized
    assert type(wire_errors.refusal(422, "newer_check")) is wire_errors.Refused
    with pytest.raises(TypeError, match="must be a Transient"):
        class Misfiled(wire_errors.Refused, code=wire_errors.ErrorCode.RATE_LIMITED):
            pass
