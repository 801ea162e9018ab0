"""`make test`'s two xdist workers never run two whole networks at once: every test module
that boots `meshrl network up` (calls `run_network`) is in tests/xdist_units.py's `NETWORK_UP`,
the one unit of work they share."""

from __future__ import annotations

from pathlib import Path

from xdist_units import NETWORK_UP
from xdist_units import unit as _unit

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_that_runs_a_network_is_in_the_one_network_unit() -> None:
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
             if p != Path(__file__) and _boots_network_up(p.read_text())
             and "mark.crosshost" not in p.read_text()}  # the cross-host test runs alone
    assert found == NETWORK_UP


def _boots_network_up(text: str) -> bool:
    # netutil's run_network, or bench_network_stop's measure (the Ctrl-C test)
    return "nu.run_network(" in text or "from bench_network_stop import" in text


def test_units_are_modules_except_the_networks() -> None:
    assert {_unit(f"{m}::test_x[a]") for m in NETWORK_UP} == {"network-up"}
    assert _unit("tests/wire/test_models.py::TestA::test_b") == "tests/wire/test_models.py"
