"""`meshrl chain claim` through a public RPC filter: the batch fits the endpoint's bounds.

A real `meshrl chain rpc-filter` process in front of a real anvil, with bounds tighter than a
64-item claim (its body, and the gas of its estimate): the claim asks the filter for its bounds
and sizes its batches under them, and a refusal for size (a body or a gas bound it did not
know of) is tried again with half the batch, down to one item (then `ClaimTooLarge`). Every
claimable item is claimed exactly once and the minted amount is their reward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrl.protocol import Protocol, RpcBackend
from meshrl.protocol.anvil import _free_port
from meshrl.protocol.claiming import claim_all, size_bounds
from pool_member import member_in_pool

pytestmark = pytest.mark.anvil
SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN, RATE, LOCK = 10**18, 10**15, 60
ITEMS = 70  # more than the contract's 64 a transaction, and many more than the filter takes


@pytest.fixture
def provider(anvil_backend, tmp_path):
    """A fresh deployment on the session's anvil: a provider with ITEMS unlocked items, and its
    key file."""
    backend = anvil_backend
    m = member_in_pool(backend, LOCK, RATE)
    p, pool, node, dep, prov = m.provider, m.pool, m.node, m.deployment, m.account
    for i in range(ITEMS):
        p.submit_work(pool, node.address, f"f{i}-{time.time_ns()}".encode().ljust(32)[:32], 10)
    backend.advance_time(LOCK + 1)
    dep_file, key_file = tmp_path / "deployment.json", tmp_path / "provider.key"
    dep.save(dep_file)
    key_file.write_text(prov.key.hex())
    os.chmod(key_file, 0o600)
    return p, pool, dep_file, key_file


def _filter(upstream: str, tmp: Path, *bounds: str) -> tuple[subprocess.Popen, str]:
    ready, port = tmp / f"ready-{time.time_ns()}", _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl.cli", "chain", "rpc-filter", "--upstream", upstream,
         "--port", str(port), "--ready_file", str(ready), *bounds],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.is_file(), proc.stderr.read().decode()[-2000:] if proc.poll() else "no url"
    return proc, ready.read_text()


def _claim_cli(url: str, pool: int, dep: Path, key: Path, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "meshrl.cli", "chain", "claim", "--chain.rpc_url", url,
         "--chain.deployment", str(dep), "--chain.key_file", str(key), "--pool", str(pool),
         *extra], env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True, timeout=240)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_chain_claim_sizes_its_batches_under_the_filters_bounds(provider, anvil_backend,
                                                                 tmp_path) -> None:
    p, pool, dep, key = provider
    # a 64-item claim is ~4.6 KB of JSON and takes ~1.2 M gas to estimate: neither fits
    proc, url = _filter(anvil_backend.url, tmp_path, "--max_body", "2048",
                        "--max_gas", "400000")
    try:
        bounds = size_bounds(url)
        assert bounds == {"max_body": 2048, "max_gas": 400_000, "max_batch": 100}
        before = p.balance()
        got = _claim_cli(url, pool, dep, key)
    finally:
        proc.terminate()
        proc.wait(10)
    assert got["claimed_items"] == ITEMS and got["amount"] == ITEMS * 10 * RATE
    assert p.balance() - before == ITEMS * 10 * RATE
    assert len(got["txs"]) >= 4 and got["batch"] < 64  # 70 items under a 2 KB body
    assert not any(w["claimable"] for w in
                   __import__("meshrl.protocol.history", fromlist=["x"])
                   .provider_rewards(p, pool, p.address)["works"])


def test_a_refusal_for_size_halves_the_batch_until_it_fits(provider, anvil_backend,
                                                            tmp_path) -> None:
    """An endpoint that does not say its bounds (the filter's /health is not asked here):
    the batch starts at 64 and halves on each refusal for size until it fits."""
    p, pool, _, _ = provider
    proc, url = _filter(anvil_backend.url, tmp_path, "--max_body", "2048",
                        "--max_gas", "400000")
    try:
        via = Protocol(RpcBackend(url), p.deployment, p.account)
        ids = [bytes.fromhex(w["work_id"]) for w in
               __import__("meshrl.protocol.history", fromlist=["x"])
               .provider_rewards(via, pool, p.address)["works"] if w["claimable"]]
        assert len(ids) == ITEMS
        before = p.balance()
        done = claim_all(via, ids, batch=64, bounds={})
        assert sum(len(b) for b in done.batches) == ITEMS
        assert done.refusals >= 1 and max(len(b) for b in done.batches) <= 32
        assert p.balance() - before == ITEMS * 10 * RATE
    finally:
        proc.terminate()
        proc.wait(10)
