"""Shared fixtures: one deployed protocol per backend (eth-tester, anvil), reverted to a base
state (chain snapshot) around every test instead of redeploying."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from meshrl.protocol import Backend, EthTesterBackend
from meshrl.protocol.anvil import AnvilNode, find_anvil

from .helpers import World, build_world


def _anvil_or_skip() -> None:
    if find_anvil() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("anvil is required in CI (make setup installs it via npm)")
        pytest.skip("anvil not installed (run `make setup`)")


@pytest.fixture(scope="session")
def anvil_backend() -> Iterator[Backend]:
    _anvil_or_skip()
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
