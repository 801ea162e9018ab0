"""The public surfaces of the wire and the two services resolve, and none of them loads torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import meshrl.discovery
import meshrl.orchestrator
import meshrl.wire

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("pkg", [meshrl.wire, meshrl.discovery, meshrl.orchestrator])
def test_every_exported_name_resolves(pkg: object) -> None:
    for name in pkg.__all__:  # type: ignore[attr-defined]
        assert getattr(pkg, name) is not None


def test_services_and_wire_do_not_import_torch() -> None:
    code = ("import sys, meshrl.wire.service, meshrl.wire.client, meshrl.wire.rollout_file, "
            "meshrl.orchestrator.service, meshrl.discovery.service, meshrl.cli; "
            "meshrl.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC)}, check=True)
    assert out.stdout.strip() == "[]"


def test_commands_are_registered() -> None:
    for role in ("orchestrator", "discovery"):
        out = subprocess.run([sys.executable, "-m", "meshrl.cli", role, "--help"],
                             capture_output=True, text=True, env={"PYTHONPATH": str(SRC)},
                             check=True)
        assert "--chain.rpc_url" in out.stdout and "--guard.rate_per_minute" in out.stdout
