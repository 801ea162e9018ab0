"""Fixtures and rules shared by every test package.

`make test` runs the suite on three pytest-xdist workers (`-n 3 --dist loadscope`); the hooks
below make that safe and balanced:
- each module is one unit of work (a module-scoped fixture, a chain or a network, is built
  once, on one worker), and the modules that boot a whole `meshrl network up` (anvil and a
  dozen role processes: `NETWORK_UP`) are one unit together, so that two such networks never
  share CI's 2 cores (`Scheduler`; xdist's own `loadgroup` cannot do this under pytest 9,
  whose node ids it can no longer suffix);
- the longest units are handed out first (the networks, then `slow`, then `anvil` modules),
  so that no long module starts last while the other workers sit idle;
- each worker runs torch on one thread, and so do the processes its tests start (their
  `OMP_NUM_THREADS` is 1 unless a test sets it): two workers with two threads each on 2 cores
  spin against each other;
- tests marked `timing` (they assert on wall-clock time) are left to a second, serial run
  (the Makefile's `test`), so they never share the cores with a running network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from anvil_rule import require_anvil
from xdist_units import unit as _unit


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        # and so does every process a test starts (roles, torchrun ranks, CLI cases), unless
        # the test says otherwise: `network up` already gives each role one thread
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")


def _rank(item: pytest.Item) -> int:
    if _unit(item.nodeid) == "network-up":
        return 0
    return 1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("anvil") else 3


def _timing_tests_found_by_their_text(items: list[pytest.Item]) -> None:
    """The Makefile's serial part collects only the modules whose text holds `mark.timing` (not
    the whole tree again): a test marked `timing` any other way would run in neither part."""
    texts: dict[str, str] = {}
    for item in items:
        if item.get_closest_marker("timing") is None:
            continue
        path = str(item.path)
        if "mark.timing" not in texts.setdefault(path, item.path.read_text()):
            raise pytest.UsageError(f"{item.nodeid} is marked timing, but its module's text "
                                    "never says `mark.timing`: `make test` would not run it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every `timing` test where the serial part looks for it; on an xdist worker: the longest
    units first (the order the scheduler hands them out), each unit's tests in their
    collection order."""
    _timing_tests_found_by_their_text(items)
    if not hasattr(config, "workerinput"):
        return  # a plain run: collection order
    rank: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        unit = _unit(item.nodeid)
        rank[unit] = min(rank.get(unit, 3), _rank(item))
        first.setdefault(unit, i)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (rank[_unit(it.nodeid)], first[_unit(it.nodeid)], order[id(it)]))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of a test marked `anvil`: skip it without anvil, fail it under CI."""
    if item.get_closest_marker("anvil") is not None:
        require_anvil()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread: on a shared, busy 2-core machine two threads wait on each other."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
