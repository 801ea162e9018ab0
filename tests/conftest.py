"""Fixtures and rules shared by every test package.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`); the hooks
below make that safe and balanced:
- every test goes with its module (one unit of work: a module-scoped fixture, a chain or a
  network, is built once, on one worker) unless it names an `xdist_group` of its own (the
  modules that boot `meshrl network up` share one, tests/network/netutil.py);
- the longest units are handed out first (whole networks, then `slow`, then `anvil` modules),
  so that no long module starts last while the other worker sits idle;
- each worker runs torch on one thread: two workers with two threads each on 2 cores spin
  against each other;
- tests marked `timing` (they assert on wall-clock time) are left to a second, serial run
  (the Makefile's `test`), so they never share the cores with a running network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from anvil_rule import require_anvil


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def _rank(item: pytest.Item) -> int:
    if any(m.args[:1] == ("network-up",) for m in item.iter_markers("xdist_group")):
        return 0
    return 1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("anvil") else 3


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return  # a plain run: collection order, no groups
    rank: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        mod = _mod(item)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(mod))
        rank[mod] = min(rank.get(mod, 3), _rank(item))
        first.setdefault(mod, i)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (rank[_mod(it)], first[_mod(it)], order[id(it)]))


def _mod(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


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
