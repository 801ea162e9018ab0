"""Fixtures and rules shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from anvil_rule import require_anvil


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
