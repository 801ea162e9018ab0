"""Shared fixtures: one deployed protocol per backend (eth-tester, anvil), reverted to a base
state (chain snapshot) around every test instead of redeploying."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from meshrl.protocol import Backend, EthTesterBackend
from meshrl.protocol.anvil import AnvilNode

from .helpers import World, build_world


@pytest.fixture(scope="session")
def anvil_backend() -> Iterator[Backend]:  # for tests marked `anvil` (tests/anvil_rule.py)
    node = AnvilNode()
    backend = node.start()
    yield backend
    node.stop()


@pytest.fixture(
    scope="session", params=["eth-tester", pytest.param("anvil", marks=pytest.mark.anvil)]
)
def base_world(request: pytest.FixtureRequest) -> World:
    if request.param == "anvil":
        backend = request.getfixturevalue("anvil_backend")
    else:
        backend = EthTesterBackend()
    return build_world(backend)


@pytest.fixture
def world(base_world: World) -> Iterator[World]:
    snap = base_world.backend.snapshot()
    yield base_world
    base_world.backend.revert(snap)


@pytest.fixture(scope="session")
def tester_world() -> World:
    """eth-tester only, for the slower property tests."""
    return build_world(EthTesterBackend())
