"""The `anvil` marker is enforced: under CI a missing anvil fails a test, elsewhere it skips it,
and every test module that starts an anvil node carries the marker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from anvil_rule import anvil_rule

TESTS = Path(__file__).resolve().parent
# what starts an anvil node in the tests (directly or through a shared helper / fixture)
STARTERS = {"start_chain", "start_net", "pool_services", "run_network",
            "anvil_backend", "pool", "disc"}


def test_missing_anvil_fails_under_ci_and_skips_elsewhere() -> None:
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        anvil_rule(None, ci=True)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        anvil_rule(None, ci=False)
    assert anvil_rule("/bin/anvil", ci=True) == anvil_rule("/bin/anvil", ci=False) == "/bin/anvil"


def _marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "anvil" in ast.unparse(node.value)
    return False


def _starts_anvil(tree: ast.Module) -> bool:
    """A test function (or the module's fixtures) names a starter: calls or fixture args."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in STARTERS - {"pool", "disc", "anvil_backend"}:
                return True
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                a.arg in STARTERS for a in node.args.args):
            return True
    return False


def test_every_module_that_starts_anvil_is_marked() -> None:
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        if _starts_anvil(tree) and not _marked(tree):
            unmarked.append(str(path.relative_to(TESTS)))
    assert unmarked == [], f"mark these `pytestmark = pytest.mark.anvil`: {unmarked}"
