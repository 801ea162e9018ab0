"""The units of work of `make test`'s two xdist workers (tests/conftest.py's scheduler), in a
module of their own (tests/ is on sys.path) so that a test can import them: `conftest` names a
different module in each test package."""

from __future__ import annotations

__all__ = ["NETWORK_UP", "unit"]

# every module that calls `netutil.run_network` (tests/test_xdist_units.py checks the list),
# and the Ctrl-C test, whose `network up` processes start through bench_network_stop.measure
NETWORK_UP = frozenset({*(f"tests/network/test_{m}_e2e.py" for m in (
    "disputes", "faults", "mixed_pool", "network", "task_mix", "tools")),
    "tests/network/test_network_stop.py"})


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or all of `NETWORK_UP` together."""
    mod = nodeid.split("::", 1)[0]
    return "network-up" if mod in NETWORK_UP else mod
