"""The committed ABI + bytecode are exactly what the pinned compiler makes of the sources."""

from __future__ import annotations

import json

import pytest

from meshrl.protocol.artifacts import (
    COMPILED_DIR,
    CONTRACTS_DIR,
    DEPLOYABLE,
    compile_contract,
    load_artifact,
)


@pytest.mark.parametrize("name", DEPLOYABLE)
def test_committed_artifact_matches_recompiled(name: str) -> None:
    fresh = compile_contract(CONTRACTS_DIR / f"{name}.vy")
    committed = load_artifact(name)
    assert committed.compiler == fresh.compiler
    assert committed.abi == fresh.abi
    assert committed.bytecode == fresh.bytecode, (
        f"{name}.json is stale: run `meshrl chain compile` and commit the result"
    )


def test_protocol_fits_the_contract_size_limit() -> None:
    # EIP-170 limits the deployed (runtime) code: read it off a deployment (the creation code
    # also carries the constructor, over 1 KB, which the limit does not count)
    from meshrl.protocol import EthTesterBackend

    from .helpers import PARAMS, build_world

    w = build_world(EthTesterBackend(), PARAMS)
    runtime = len(w.backend.w3.eth.get_code(w.fed.contract.address))
    assert 20_000 < runtime < 24_576


def test_every_external_function_has_natspec() -> None:
    import re

    seen = 0
    for path in CONTRACTS_DIR.glob("*.vy"):
        src = path.read_text()
        for m in re.finditer(r"@external\n(?:@\w+\n)*def (\w+)\([^)]*\)[^:\n]*:\n(\s+)(\S+)", src):
            assert m.group(3).startswith('"""'), f"{path.name}: {m.group(1)} lacks NatSpec"
            seen += 1
    assert seen >= 30  # the pattern really finds the external functions


def test_artifacts_are_json_with_abi_and_bytecode() -> None:
    for name in DEPLOYABLE:
        data = json.loads((COMPILED_DIR / f"{name}.json").read_text())
        assert set(data) == {"name", "compiler", "abi", "bytecode"}
        assert data["bytecode"].startswith("0x") and len(data["bytecode"]) > 1000
