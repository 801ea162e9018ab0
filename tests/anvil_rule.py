"""The `anvil` marker's rule, in one place (tests/ is on sys.path): a test that needs a local
anvil node is skipped where none is installed, except under `CI=true`, where a missing anvil is
a failure (CI installs it with `make setup`; a skip there would hide every end-to-end test).

tests/conftest.py applies it before every test marked `anvil`; fixtures that start anvil for
tests marked so need no check of their own."""

from __future__ import annotations

import os

import pytest

__all__ = ["anvil_rule", "require_anvil"]


def anvil_rule(found: str | None, ci: bool) -> str:
    """`found` (anvil's path) when there is one; else a skip, or under CI a failure."""
    if found is not None:
        return found
    if ci:
        pytest.fail("anvil is required in CI (`make setup` installs it via npm)", pytrace=False)
    pytest.skip("anvil not installed (run `make setup`)")


def require_anvil() -> str:
    from meshrl.protocol.anvil import find_anvil

    return anvil_rule(find_anvil(), os.environ.get("CI") == "true")
