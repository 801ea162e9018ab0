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
    ext = w.fed.contract.functions.EXTENSION().call()
    assert 1_000 < len(w.backend.w3.eth.get_code(ext)) < 24_576


def _layout(name: str) -> tuple[dict[str, tuple[int, int]], dict]:
    import vyper
    from vyper.compiler.input_bundle import FilesystemInputBundle

    path = (CONTRACTS_DIR / f"{name}.vy").resolve()
    out = vyper.compile_code(path.read_text(), contract_path=path.name, resolved_path=path,
                             input_bundle=FilesystemInputBundle([path.parent]),
                             output_formats=["layout"])["layout"]

    def flat(d: dict, pre: str = "") -> dict[str, tuple[int, int]]:
        got: dict[str, tuple[int, int]] = {}
        for k, v in d.items():
            if "slot" in v:
                got[pre + k] = (v["slot"], v["n_slots"])
            else:
                got.update(flat(v, pre + k + "."))
        return got

    return flat(out["storage_layout"]), out["transient_storage_layout"]


def test_the_extension_runs_on_the_protocols_storage_layout() -> None:
    # batches.vy runs by DELEGATECALL on the protocol's storage: every variable the two share
    # must sit in the same slots, the extension's own after all of the protocol's
    proto, proto_t = _layout("protocol")
    ext, ext_t = _layout("batches")
    assert {k: ext[k] for k in proto} == proto
    end = max(slot + n for slot, n in proto.values())
    own = {k: v for k, v in ext.items() if k not in proto}
    assert own and all(slot >= end for slot, _ in own.values())
    assert proto_t == ext_t  # the one re-entrancy lock


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
