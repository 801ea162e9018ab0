"""The orchestrator's per-node money (stake, slashes, rewards earned / claimed / claimable)
equals what the chain says: `pool_history` (the report's source) and the stake contract, after
submissions, a partial claim, a hard invalidation that wipes locked work, and a restart that
must catch the books up for a database from before them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_utils import keccak

from meshrl.protocol.history import pool_history
from meshrl.wire import SignedClient
from meshrl.wire.models import PoolNodes

from .conftest import Pool, pool_services
from .net import PARAMS, run, wait_for

pytestmark = pytest.mark.anvil

LOCK = PARAMS.lock_period


@pytest.fixture(scope="module")
def books_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The pool with its history made before any test of the module, so each test sees it
    whatever runs first: submissions, a partial claim, a hard invalidation that wipes n5's
    locked work."""
    members = (("n1", "p1"), ("n2", "p1"), ("n5", "p2"))
    with pool_services(tmp_path_factory.mktemp("books"), members) as p:
        _history(p)
        yield p


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


def _history(pool: Pool) -> None:
    c = pool.chain
    a = _submit(pool, "p1", "n1", "a", 10)
    _submit(pool, "p1", "n2", "b", 20)
    _submit(pool, "p2", "n5", "c", 30)
    c.fed.backend.advance_time(LOCK + 1)
    c.client("p1").claim([a])  # a subset of p1's unlocked items: its transaction says which
    _submit(pool, "p2", "n5", "d", 40)  # locked when n5 is judged: wiped
    bad = _submit(pool, "p2", "n5", "e", 5)
    c.client("val").hard_invalidate(bad)
    c.fed.backend.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]


def test_money_per_node_equals_the_chain_then_a_claim_of_all_and_a_restart(
        books_pool: Pool) -> None:
    """One story (its steps build on each other): the module's history, then p1 claims the rest
    and adds stake, then the orchestrator restarts on a database from before the books."""
    pool, c = books_pool, books_pool.chain
    truth = _matches(pool)
    rate = c.fed.pool(c.pool).reward_rate
    n1, n2, n5 = (c.accounts[n].address.lower() for n in ("n1", "n2", "n5"))
    stake = 1000 * 10**18
    assert truth == {n1: (stake, 0, 10 * rate, 10 * rate, 0),
                     n2: (stake, 0, 20 * rate, 0, 20 * rate),
                     n5: (stake - PARAMS.slash_penalty, PARAMS.slash_penalty, 30 * rate, 0,
                          30 * rate)}
    b = c.fed.work_id(c.accounts["n2"].address, keccak(text="b"))
    c.client("p1").claim([b])  # the rest of p1's unlocked items
    c.client("p1").add_stake(7 * 10**18)
    c.fed.backend.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    before = _matches(pool)
    assert before[n1][0] == before[n2][0] == 1007 * 10**18
    assert before[n2][3:] == (20 * rate, 0)
    # the orchestrator restarts on a database whose books were never kept
    pool.orch.stop()
    db = sqlite3.connect(Path(pool.tmp) / "orch.db")
    for table in ("works", "accounts", "providers", "wipes", "pending", "verdicts"):
        db.execute(f"DROP TABLE {table}")
    db.execute("DELETE FROM meta WHERE key IN ('books_since', 'lock_period', "
               "'invalidation_window', 'chain_time')")
    db.commit()
    db.close()
    pool.orch.start()
    assert _matches(pool) == before


def _run_dir(pool: Pool, tmp: Path) -> Path:
    """A network run directory whose dashboard reads this orchestrator (no shardcast, no
    trainer: those parts stay empty)."""
    c = pool.chain
    key_file = tmp / "trainer.key"
    key_file.write_text(pool.key("trainer"))
    workers = {n: {"node": c.accounts[n].address, "dishonest": n == "n5"}
               for n in ("n1", "n2", "n5")}
    (tmp / "network.json").write_text(json.dumps({
        "pool_id": c.pool, "orchestrator": pool.orch.url, "trainer_key_file": str(key_file),
        "workers": workers, "relays": [], "origin": "http://127.0.0.1:9",
        "trainer_dir": str(tmp / "trainer")}))
    return tmp


def test_dashboard_shows_the_chain_numbers(books_pool: Pool, tmp_path: Path) -> None:
    """The dashboard's node rows carry the orchestrator's chain numbers (its only source)."""
    from meshrl.dashboard.state import collect_state_sync

    truth = _matches(books_pool)
    state = collect_state_sync(_run_dir(books_pool, tmp_path))
    assert state["errors"] == []
    got = {r["node"].lower(): (r["stake"], r["slashed"], r["earned"], r["claimed"],
                               r["claimable"]) for r in state["nodes"]}
    assert got == truth


class _Dashboard:
    """The dashboard app served from a thread of this process, on a free port."""

    def __init__(self, run_dir: Path) -> None:
        from aiohttp import web

        from meshrl.dashboard.app import build_dashboard
        from meshrl.dashboard.config import DashboardConfig

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(build_dashboard(DashboardConfig(run=str(run_dir),
                                                                    refresh_s=0.5)))
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_page_in_headless_chromium_shows_stake_and_slash(books_pool: Pool,
                                                         tmp_path: Path) -> None:
    browser, driver_bin = "/usr/bin/chromium", "/usr/bin/chromedriver"
    if not (Path(browser).exists() and Path(driver_bin).exists()):
        pytest.skip("chromium / chromedriver not installed")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service as ChromeService

    truth = _matches(books_pool)
    dash = _Dashboard(_run_dir(books_pool, tmp_path))
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(driver_bin), options=opts)
    try:
        driver.get(dash.url + "/")
        cells = ("return [...document.querySelectorAll('#nodes tbody tr')]"
                 ".map(r => [...r.cells].map(c => c.textContent));")
        deadline = time.monotonic() + 30
        while len(rows := driver.execute_script(cells)) != 3:
            assert time.monotonic() < deadline, "nodes not shown"
            time.sleep(0.2)
        head = driver.find_element("css selector", "#nodes thead").text
        assert all(col in head for col in ("stake", "slashed", "earned", "claimable"))
        by_name = {r[0].split(" ")[0]: r[7:] for r in rows}
        accounts = books_pool.chain.accounts
        # stake, slashed, earned, claimable in tokens (3 decimals), as the chain has them
        # (whether or not the claim of all has run: tests of this module run in any order)
        for name in ("n1", "n2", "n5"):
            stake, slashed, earned, _, claimable = truth[accounts[name].address.lower()]
            assert by_name[name] == [f"{v / 1e18:.3f}" for v in (stake, slashed, earned,
                                                                 claimable)], name
        assert by_name["n5"][:2] == ["950.000", "50.000"]  # the module's slash is shown
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert driver.save_screenshot(str(tmp_path / "dashboard.png"))
    finally:
        driver.quit()
        dash.close()
