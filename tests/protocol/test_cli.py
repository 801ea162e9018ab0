"""`meshrl chain ...` against real anvil nodes: local node start-up, deploy, main actions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from meshrl.cli import main
from meshrl.protocol import Deployment
from meshrl.protocol.anvil import _free_port
from meshrl.protocol.local import ANVIL_DEV_KEY, to_base_units

from .helpers import TOKEN, key

pytestmark = pytest.mark.anvil
SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}


def _run(capsys, *args: str) -> tuple[int, list[dict], str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_chain_node_starts_anvil_and_writes_deployment(anvil_backend, tmp_path, capsys) -> None:
    path = tmp_path / "deployment.json"

    def host_handler(signum: int, frame: object) -> None:  # the in-process caller's own
        raise AssertionError("not to be called")

    previous = signal.signal(signal.SIGTERM, host_handler)
    try:
        rc, out, _ = _run(
            capsys, "chain", "node", "--port", str(_free_port()), "--chain.deployment", str(path),
            "--run_seconds", "0.2",
        )  # fmt: skip
        assert signal.getsignal(signal.SIGTERM) is host_handler  # the command's is gone
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rc == 0
    dep = Deployment.load(path)
    assert dep.chain_id == 31337 and out[0]["protocol"] == dep.protocol
    assert out[0]["url"].startswith("http://127.0.0.1:")


def test_chain_node_exits_cleanly_on_sigterm(anvil_backend, tmp_path) -> None:
    """As the supervisor stops it: SIGTERM ends the command with status 0 and stops anvil."""
    path = tmp_path / "deployment.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "chain", "node", "--port", str(_free_port()),
         "--chain.deployment", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV,
    )  # fmt: skip
    try:
        url = json.loads(proc.stdout.readline())["url"]  # type: ignore[union-attr]
        assert _answers(url)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not _answers(url)  # anvil went with it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _answers(url: str) -> bool:
    req = urllib.request.Request(url, data=b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}',
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_chain_commands(anvil_backend, tmp_path, capsys) -> None:
    url, path = anvil_backend.url, str(tmp_path / "dep.json")
    common = ["--chain.rpc_url", url, "--chain.deployment", path]
    provider = key("cli-provider")
    anvil_backend.fund(provider.address, 10**20)
    as_fed = [*common, "--chain.private_key", ANVIL_DEV_KEY]
    as_provider = [*common, "--chain.private_key", "0x" + provider.key.hex()]

    rc, out, _ = _run(capsys, "chain", "deploy", *as_fed, "--params.min_stake", str(TOKEN))
    assert rc == 0 and Deployment.load(path).protocol == out[0]["protocol"]
    assert (
        _run(capsys, "chain", "mint", *as_fed, "--to", provider.address, "--tokens", "50")[0] == 0
    )
    rc, out, _ = _run(capsys, "chain", "register", *as_provider, "--tokens", "10")
    assert rc == 0 and out[0]["stake"] == 10 * TOKEN
    rc, out, _ = _run(capsys, "chain", "stake", *as_provider, "--tokens", "2.5")
    assert rc == 0 and out[0]["stake"] == to_base_units("12.5")
    rc, out, _ = _run(capsys, "chain", "create-pool", *as_fed, "--domain", "math")
    assert rc == 0 and out[0]["pool"] == 1 and out[0]["status"] == 2
    rc, out, _ = _run(
        capsys, "chain", "create-pool", *as_fed, "--domain", "math", "--max_units", "500",
        "--min_interval", "30",
    )  # fmt: skip
    assert out[0]["domain"] == 1 and out[0]["pool"] == 2  # the domain is reused
    assert (out[0]["max_units"], out[0]["min_interval"]) == (500, 30)
    rc, out, _ = _run(
        capsys, "chain", "balances", *common, "--addresses", f'["{provider.address}"]'
    )
    assert out[0]["tokens"] == to_base_units("37.5") and out[0]["stake"] == to_base_units("12.5")
    rc, out, _ = _run(capsys, "chain", "status", *common)
    assert rc == 0 and out[0]["pools"] == 2 and out[0]["stake"] == to_base_units("12.5")
    rc, out, _ = _run(capsys, "chain", "works", *common, "--pool", "1")
    assert rc == 0 and (out[0]["pool"], out[0]["works"], out[0]["rewards"]) == (1, [], {})

    rc, _, err = _run(capsys, "chain", "register", *as_provider, "--tokens", "10")
    assert rc == 1 and "stake: already registered" in err
    rc, out, _ = _run(capsys, "chain", "propose-federator", *as_fed, "--to", provider.address)
    assert rc == 0 and out[0]["proposed"] == provider.address
    rc, out, _ = _run(capsys, "chain", "accept-federator", *as_provider)
    assert rc == 0 and out[0]["federator"] == provider.address
    rc, _, err = _run(capsys, "chain", "mint", *as_fed, "--tokens", "1")
    assert rc == 1 and "roles: not federator" in err  # the old key lost the token too
    rc, _, err = _run(capsys, "chain", "status", *common, "--chain.chain_id", "84532")
    assert rc == 1 and "is chain 31337, expected 84532" in err
    rc, _, err = _run(
        capsys,
        "chain",
        "status",
        "--chain.rpc_url",
        url,
        "--chain.deployment",
        str(tmp_path / "missing.json"),
    )
    assert rc == 1 and "no deployment file" in err
