"""The orchestrator's per-node money (stake, slashes, rewards earned / claimed / claimable)
equals what the chain says: `pool_history` (the report's source) and the stake contract, after
submissions, a partial claim, a hard invalidation that wipes locked work, and a restart that
must catch the books up for a database from before them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_utils import keccak

from meshrl.protocol.history import pool_history
from meshrl.wire import SignedClient
from meshrl.wire.models import PoolNodes

from .conftest import Pool, anvil_or_skip, orchestrator_config
from .net import PARAMS, Service, onboard, run, start_chain, wait_for

LOCK = PARAMS.lock_period


@pytest.fixture(scope="module")
def books_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    anvil_or_skip()
    tmp = tmp_path_factory.mktemp("books")
    chain = start_chain(tmp)
    disc = Service("discovery", {
        "port": 0, "db": str(tmp / "disc.db"), "sync_s": 0.5, "manager_cache_s": 0.0,
        "chain": {"deployment": str(chain.deployment), "rpc_url": chain.node.url}}, tmp)
    orch: Service | None = None
    try:
        disc.start()
        cfg = orchestrator_config(chain, tmp)
        cfg["onboarding"] = {**cfg["onboarding"], "discovery_url": disc.url}
        orch = Service("orchestrator", cfg, tmp)
        orch.start()
        for node, provider in (("n1", "p1"), ("n2", "p1"), ("n5", "p2")):
            run(onboard(chain, disc.url, orch.url, node, provider))
        yield Pool(chain, disc, orch, tmp)
    finally:
        if orch is not None:
            orch.stop()
        disc.stop()
        chain.close()


def _submit(pool: Pool, provider: str, node: str, label: str, units: int) -> bytes:
    f = keccak(text=label)
    addr = pool.chain.accounts[node].address
    pool.chain.client(provider).submit_work(pool.chain.pool, addr, f, units)
    return pool.chain.fed.work_id(addr, f)


async def _nodes(pool: Pool) -> dict[str, Any]:
    async with SignedClient(pool.orch.url, pool.key("trainer")) as c:
        got = await c.call("GET", "/nodes", response=PoolNodes)
    return {n.address.lower(): n for n in got.nodes}


def _truth(pool: Pool) -> dict[str, tuple[int, int, int, int, int]]:
    """Per node: (stake, slashed, earned, claimed, claimable) as the chain has them."""
    fed = pool.chain.fed
    h = pool_history(fed, pool.chain.pool)
    slashed: dict[str, int] = {}
    for inv in h["invalidations"]:
        slashed[inv["node"].lower()] = slashed.get(inv["node"].lower(), 0) + inv["slashed"]
    out = {}
    for node, provider in (("n1", "p1"), ("n2", "p1"), ("n5", "p2")):
        a = pool.chain.accounts[node].address.lower()
        r = h["rewards"].get(a, {"earned": 0, "claimed": 0, "claimable": 0})
        out[a] = (fed.provider(pool.chain.accounts[provider].address).stake,
                  slashed.get(a, 0), r["earned"], r["claimed"], r["claimable"])
    return out


def _matches(pool: Pool) -> dict[str, tuple[int, int, int, int, int]]:
    truth = _truth(pool)

    async def check() -> bool:
        got = await _nodes(pool)
        mine = {a: (n.stake, n.slashed, n.rewards_earned, n.rewards_claimed,
                    n.rewards_claimable) for a, n in got.items() if a in truth}
        return mine == truth

    try:
        run(wait_for(check, timeout=15))
    except TimeoutError:
        got = run(_nodes(pool))
        pytest.fail(f"orchestrator {got} != chain {truth}")
    return truth


def test_money_per_node_equals_the_chain(books_pool: Pool) -> None:
    pool, c = books_pool, books_pool.chain
    a = _submit(pool, "p1", "n1", "a", 10)
    _submit(pool, "p1", "n2", "b", 20)
    _submit(pool, "p2", "n5", "c", 30)
    c.fed.backend.advance_time(LOCK + 1)
    c.client("p1").claim([a])  # a subset of p1's unlocked items: the chain says which
    _submit(pool, "p2", "n5", "d", 40)  # locked when n5 is judged: wiped
    bad = _submit(pool, "p2", "n5", "e", 5)
    c.client("val").hard_invalidate(bad)
    c.fed.backend.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    truth = _matches(pool)
    rate = c.fed.pool(c.pool).reward_rate
    n1, n2, n5 = (c.accounts[n].address.lower() for n in ("n1", "n2", "n5"))
    stake = 1000 * 10**18
    assert truth == {n1: (stake, 0, 10 * rate, 10 * rate, 0),
                     n2: (stake, 0, 20 * rate, 0, 20 * rate),
                     n5: (stake - PARAMS.slash_penalty, PARAMS.slash_penalty, 30 * rate, 0,
                          30 * rate)}


def test_claim_of_all_and_a_database_from_before_the_books(books_pool: Pool) -> None:
    pool, c = books_pool, books_pool.chain
    b = c.fed.work_id(c.accounts["n2"].address, keccak(text="b"))
    c.client("p1").claim([b])  # every candidate of p1: matched without reading the chain
    c.client("p1").add_stake(7 * 10**18)
    c.fed.backend.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    before = _matches(pool)
    assert before[c.accounts["n1"].address.lower()][0] == 1007 * 10**18
    # the orchestrator restarts on a database whose books were never kept
    pool.orch.stop()
    db = sqlite3.connect(Path(pool.tmp) / "orch.db")
    for table in ("works", "accounts", "providers", "wipes", "pending"):
        db.execute(f"DROP TABLE {table}")
    db.execute("DELETE FROM meta WHERE key IN ('books_since', 'lock_period', 'chain_time')")
    db.commit()
    db.close()
    pool.orch.start()
    assert _matches(pool) == before


def test_dashboard_shows_the_chain_numbers(books_pool: Pool, tmp_path: Path) -> None:
    """The dashboard's node rows carry the orchestrator's chain numbers (its only source)."""
    from meshrl.dashboard.state import collect_state_sync

    pool, c = books_pool, books_pool.chain
    truth = _matches(pool)
    key_file = tmp_path / "trainer.key"
    key_file.write_text(pool.key("trainer"))
    workers = {n: {"node": c.accounts[n].address, "dishonest": n == "n5"}
               for n in ("n1", "n2", "n5")}
    (tmp_path / "network.json").write_text(json.dumps({
        "pool_id": c.pool, "orchestrator": pool.orch.url, "trainer_key_file": str(key_file),
        "workers": workers, "relays": [], "origin": "http://127.0.0.1:9",
        "trainer_dir": str(tmp_path / "trainer")}))
    state = collect_state_sync(tmp_path)
    assert state["errors"] == []
    got = {r["node"].lower(): (r["stake"], r["slashed"], r["earned"], r["claimed"],
                               r["claimable"]) for r in state["nodes"]}
    assert got == truth
