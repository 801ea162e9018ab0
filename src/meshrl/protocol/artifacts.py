"""Compiled contracts: compile the Vyper sources offline and load the committed ABI + bytecode.

The artifacts under `contracts/compiled/` are committed so that running the protocol needs no
compiler run; `tests/protocol/test_artifacts.py` recompiles and compares them, and
`python -m meshrl.protocol.artifacts` rewrites them after a contract change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMPILED_DIR",
    "CONTRACTS_DIR",
    "DEPLOYABLE",
    "Artifact",
    "compile_contract",
    "load_artifact",
    "runtime_matches",
    "write_artifacts",
]

CONTRACTS_DIR = Path(__file__).parent / "contracts"
COMPILED_DIR = CONTRACTS_DIR / "compiled"
# batches: the protocol's extension, run by DELEGATECALL on the protocol's storage (EIP-170)
DEPLOYABLE = ("token", "protocol", "batches")


@dataclass(frozen=True)
class Artifact:
    """A deployable contract: its name, ABI and creation bytecode (0x-prefixed hex)."""

    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    compiler: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compiler": self.compiler,
            "abi": self.abi,
            "bytecode": self.bytecode,
        }


def compile_contract(path: str | Path) -> Artifact:
    """Compile one Vyper file (its sibling modules are importable with `from . import x`)."""
    import vyper
    from vyper.compiler.input_bundle import FilesystemInputBundle

    path = Path(path).resolve()
    out = vyper.compile_code(
        path.read_text(),
        contract_path=path.name,
        resolved_path=path,
        input_bundle=FilesystemInputBundle([path.parent]),
        output_formats=["abi", "bytecode"],
    )
    return Artifact(path.stem, out["abi"], out["bytecode"], f"vyper-{vyper.__version__}")


def load_artifact(name: str) -> Artifact:
    """The committed artifact of a deployable contract (`token`, `protocol` or `batches`)."""
    data = json.loads((COMPILED_DIR / f"{name}.json").read_text())
    return Artifact(data["name"], data["abi"], data["bytecode"], data["compiler"])


def runtime_matches(name: str, code: bytes, max_tail: int = 1024) -> bool:
    """Whether `code` (a contract's runtime code on chain) is this package's contract `name`:
    Vyper's creation code carries the runtime code verbatim (immutables, if any, are appended
    after it on deployment, at most `max_tail` bytes)."""
    if not code:
        return False
    init = bytes.fromhex(load_artifact(name).bytecode.removeprefix("0x"))
    return any(code[:len(code) - n] in init for n in range(0, min(max_tail, len(code) - 1), 32))


def write_artifacts(out_dir: Path = COMPILED_DIR) -> list[Path]:
    """Recompile every deployable contract and write `<name>.json` files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DEPLOYABLE:
        art = compile_contract(CONTRACTS_DIR / f"{name}.vy")
        path = out_dir / f"{name}.json"
        path.write_text(json.dumps(art.to_json(), indent=1, sort_keys=True) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_artifacts():
        print(p)
