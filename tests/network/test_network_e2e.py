"""`meshrl network up` end to end, shortened: anvil, discovery, orchestrator, a shardcast origin
and two relays, the trainer, two validators that split the files (verdicts disputable for a
minute), two honest workers and one that forges rewards after step 1, as separate processes.
Checked against the chain, the orchestrator's ledger and the trainer's records: the cheater is
accused (and ejected) within two steps of its first dishonest file, hard-invalidated and
slashed once the verdict settles, and none of its dishonest rollouts is trained on; honest
workers are never invalidated and their rewards can be claimed after the lock; no file is used
or judged twice; Ctrl-C stops every role cleanly.

The tests run in any order: what changes the network is done by its fixture, not by a test.
Before the first test an honest provider claims its rewards after the lock (recorded in
`Claim`); after the last one Ctrl-C stops the network and `_ctrl_c_stops_every_role` checks it
(a failure there is an error at the teardown of the module's last test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netutil as nu
import pytest

from meshrl.network.keys import dev_account
from meshrl.protocol import Protocol, WorkStatus
from meshrl.rl.network_source import read_records

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = 10**18
AFTER_STEP = 1  # the cheater is honest at pool steps 0..1
STEPS = 7
CHEAT = f'{{ mode = "forge-rewards", after_step = {AFTER_STEP} }}'
CONFIG = nu.short_network("e2e", steps=STEPS, checkpoint_every=2, top="max_minutes = 25",
                          workers=f"honest = 2\ndishonest = 1\ncheat = {CHEAT}")


@dataclass(frozen=True)
class Claim:
    """An honest provider's claim of its node's rewards once the lock passed."""

    provider: str
    works: list[bytes]  # every submission of the node when the trainer had finished
    newest_locked: bool  # claimable before the lock passed?
    ready: list[bytes]  # claimable after it
    owed: int
    balance_before: int
    balance_after: int


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[tuple[Path, subprocess.Popen[bytes], Claim]]:
    run = nu.run_network(tmp_path_factory.mktemp("network"), CONFIG, "e2e")
    root, proc = next(run)
    try:
        # verdicts are disputable: the last ones settle a dispute period after they were made
        # (cut short once each has its vote: `settled_verdicts`)
        chain, pool = nu.chain(root), nu.info(root)["pool_id"]
        nu.wait(lambda: nu.settled_verdicts(chain, pool) is not None, 300,
                "verdicts still open", every=1.0)
        claim = _claim_after_the_lock(root)
        yield root, proc, claim
        _ctrl_c_stops_every_role(root, proc)
    finally:
        run.close()


def _claim_after_the_lock(root: Path) -> Claim:
    info, chain = nu.info(root), nu.chain(root)
    evs = _chain_events(chain)
    honest = {n: w for n, w in info["workers"].items() if not w["dishonest"]}
    submitted = {n: [bytes(e.args["work_id"]) for e in evs if e.name == "WorkSubmitted"
                     and e.args["node"].lower() == w["node"].lower()] for n, w in honest.items()}
    # the claimant is the honest node with the most work: pacing hands the pool's few files to
    # whichever member asks first, so on a loaded machine one honest member may have none
    name = max(submitted, key=lambda n: len(submitted[n]))
    assert submitted[name], "no honest worker submitted any work:\n" + "\n".join(
        f"--- {n}.log\n{_tail(root / 'logs' / f'{n}.log')}" for n in honest)
    w, works = honest[name], submitted[name]
    newest_locked = bool(works) and not chain.claimable(works[-1])
    chain.backend.advance_time(600 + 1)
    ready = [wid for wid in works if chain.claimable(wid)]
    owed = sum(chain.work(wid).reward for wid in ready)
    me = chain.as_(dev_account_of(w["provider"]))
    before = chain.balance(w["provider"])
    for i in range(0, len(ready), 64):  # the contract takes at most 64 ids per claim
        me.claim(ready[i:i + 64])
    return Claim(w["provider"], works, newest_locked, ready, owed, before,
                 chain.balance(w["provider"]))


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() \
        else "(no log)"


def _chain_events(chain: Protocol) -> list[Any]:
    return chain.events().poll()


def test_cheater_slashed_ejected_within_two_steps_never_trained_on(net) -> None:
    root, _, _ = net
    info, chain, ledger = nu.info(root), nu.chain(root), nu.ledger(root)
    bad = info["workers"]["cheater-0"]
    node, provider = bad["node"].lower(), bad["provider"]
    mine = [e for e in ledger.values() if e.node.lower() == node]
    dishonest = [e for e in mine if e.policy_version > AFTER_STEP]
    assert dishonest, "the cheater never reached its dishonest steps"
    assert {e.status.value for e in dishonest} <= {"hard_invalidated", "granted", "expired",
                                                  "uploaded"}
    evs = _chain_events(chain)
    hard = [e for e in evs if e.name == "WorkInvalidated" and e.args["hard"]
            and e.args["node"].lower() == node]
    assert hard
    slashed = sum(e.args["slashed"] for e in hard)
    assert slashed >= 50 * TOKEN and chain.provider(provider).stake == 100 * TOKEN - slashed
    assert any(e.name == "NodeEjected" and e.args["node"].lower() == node for e in evs)
    assert chain.node(bad["node"]).pool == 0
    # blacklisted by the orchestrator, so its worker stops for good and is retired, not
    # restarted (the honest ones stay)
    assert chain.is_blacklisted(info["pool_id"], bad["node"])
    nu.wait(lambda: any(e["event"] == "retired" and e["role"] == "cheater-0"
                        for e in nu.events(root)), 60, "the blacklisted cheater was not retired")
    assert not [e for e in nu.events(root) if e["event"] == "retired"
                and e["role"] != "cheater-0"]
    # within two steps: when the first hard accusation was mined (it locks the file's reward
    # and ejects the node; upheld, it slashed once its dispute period was over), the trainer
    # had not yet taken the batch of step (first dishonest step + 2)
    first_bad = min(e.policy_version for e in dishonest)
    accused = [e for e in evs if e.name == "WorkAccused" and e.args["hard"]
               and e.args["node"].lower() == node]
    t_inv = chain.backend.w3.eth.get_block(accused[0].block)["timestamp"]
    records = read_records(root / "trainer" / "rollouts.jsonl")
    taken_before = [r["step"] for r in records if r["t"] < t_inv]
    assert max(taken_before, default=-1) <= first_bad + 1, (first_bad, taken_before)
    # never trained on: every used file is accepted in the ledger and valid on chain
    for r in records:
        for f in r["used"]:
            assert ledger[f["sha256"]].status.value == "accepted", f
            wid = chain.work_id(f["node"], bytes.fromhex(f["sha256"]))
            assert chain.work(wid).status in (WorkStatus.SUBMITTED, WorkStatus.CLAIMED)
            if f["node"].lower() == node:
                assert f["version"] <= AFTER_STEP, f


def test_trainer_records_against_the_ledger(net) -> None:
    root, _, _ = net
    ledger = nu.ledger(root)
    records = read_records(root / "trainer" / "rollouts.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    used = [f["sha256"] for r in records for f in r["used"]]
    seen = used + [f["sha256"] for r in records for f in r["dropped"]]
    assert len(seen) == len(set(seen)), "a file was taken twice"
    for r in records:
        assert sum(f["groups"] + f["excluded"] for f in r["used"]) >= 8
        for f in r["used"]:
            e = ledger[f["sha256"]]
            assert 0 <= r["step"] - e.policy_version <= 2  # the async rule
            assert (e.node.lower(), e.policy_version) == (f["node"].lower(), f["version"])
    metrics = [json.loads(x) for x in (root / "trainer" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [m["step"] for m in metrics if m["kind"] == "step"] == list(range(1, STEPS + 1))


def test_no_work_judged_twice(net) -> None:
    root, _, _ = net
    chain = nu.chain(root)
    evs = _chain_events(chain)
    judged = [bytes(e.args["work_id"]) for e in evs if e.name == "WorkInvalidated"]
    assert len(judged) == len(set(judged))
    verdicts = [json.loads(x) for x in (root / "logs" / "validator.log").read_text()
                .splitlines() if '"msg": "verdict"' in x]
    shas = [v["sha256"] for v in verdicts]
    assert shas and len(shas) == len(set(shas))


def test_honest_never_invalidated_and_paid_after_the_lock(net) -> None:
    root, _, claim = net
    info, chain = nu.info(root), nu.chain(root)
    evs = _chain_events(chain)
    honest = [w for w in info["workers"].values() if not w["dishonest"]]
    for w in honest:
        node = w["node"].lower()
        assert not [e for e in evs if e.name == "WorkInvalidated"
                    and e.args["node"].lower() == node]
        assert chain.node(w["node"]).pool == info["pool_id"]
    assert claim.works and claim.newest_locked  # the newest was locked until the lock passed
    assert claim.ready == claim.works and claim.owed > 0
    assert claim.balance_after == claim.balance_before + claim.owed
    assert all(chain.work(wid).status == WorkStatus.CLAIMED for wid in claim.ready)


def dev_account_of(address: str) -> Any:
    for i in range(64):
        a = dev_account(i)
        if a.address.lower() == address.lower():
            return a
    raise KeyError(address)


def _chromium() -> tuple[str, str] | None:
    browser, driver = "/usr/bin/chromium", "/usr/bin/chromedriver"
    if not (Path(browser).exists() and Path(driver).exists()):
        return None
    return browser, driver


def test_dashboard_in_headless_chromium(net) -> None:
    """The live page in a real Chromium: no console errors, the running nodes shown, updated
    without a reload; its screenshot is saved with the test output (runs/test-output/)."""
    found = _chromium()
    if found is None:
        pytest.skip("chromium / chromedriver not installed (apt-get install chromium "
                    "chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    root, _, _ = net
    url = nu.info(root)["dashboard"]  # the network's own `dashboard` role
    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = None
    try:
        nu.wait(lambda: _get_ok(url + "/health"), 60, "dashboard not up", 0.5)
        driver = webdriver.Chrome(service=Service(found[1]), options=opts)
        driver.set_window_size(1200, 1400)
        driver.get(url + "/")
        rows = lambda: driver.find_elements("css selector", "#nodes tbody tr")  # noqa: E731
        nu.wait(lambda: len(rows()) == 3, 60, "nodes not shown", 0.5)
        text = driver.find_element("id", "nodes").text
        assert "worker-0" in text and "worker-1" in text and "cheater-0 (cheat)" in text
        assert "healthy" in text
        first = driver.find_element("id", "status").text
        nu.wait(lambda: driver.find_element("id", "status").text != first, 30,
              "page did not update", 0.5)
        assert driver.find_elements("css selector", "#versions tbody tr")
        assert driver.find_elements("css selector", "#reward polyline")
        assert "rewards" in driver.find_element("id", "invalid").text
        head = driver.find_element("css selector", "#nodes thead").text
        assert all(c in head for c in ("stake", "slashed", "earned", "claimable"))

        def cheater_slashed() -> str:  # the slashed column (9th) of the cheater's row, read
            # in one script: the page replaces its rows on every refresh
            return driver.execute_script(
                "const r = [...document.querySelectorAll('#nodes tbody tr')]"
                ".find(t => t.textContent.includes('(cheat)'));"
                "return r ? r.cells[8].textContent : '';")

        nu.wait(lambda: cheater_slashed() not in ("", "0.000"), 60, "slash not shown", 0.5)
        out = ROOT / "runs" / "test-output"
        out.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(out / "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        if driver is not None:
            driver.quit()


def _get_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _ctrl_c_stops_every_role(root: Path, proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(180) == 0
    ev = nu.events(root)
    assert {e["role"] for e in ev if e["event"] == "start"} >= {"anvil", *nu.info(root)["roles"]}
    # an ejected cheater's worker may end on its refused work order; every other role cleanly
    assert all(e["rc"] in (0, -15) for e in ev if e["event"] == "stopped"
               and not e["role"].startswith("cheater"))
    for e in ev:
        if e["event"] == "start":  # every process the supervisor started is gone
            with pytest.raises(ProcessLookupError):
                os.kill(e["pid"], 0)
    assert json.loads((root / "outcome.json").read_text())["outcome"] == "trained"
    # the report, written before the roles stopped, agrees with the chain and the records
    rep = json.loads((root / "report.json").read_text())
    nodes = rep["nodes"]
    assert nodes["cheater-0"]["stake_slashed"] >= 50 * TOKEN
    assert nodes["cheater-0"]["files"].get("hard_invalidated", 0) >= 1
    for name in ("worker-0", "worker-1"):
        assert nodes[name]["stake_slashed"] == 0 and "hard_invalidated" not in nodes[name]["files"]
    used = sum(len(r["used"]) for r in read_records(root / "trainer" / "rollouts.jsonl"))
    assert sum(n["trained_on"] for n in nodes.values()) == used
    assert rep["steps"] == STEPS and (root / "report.md").is_file()
    # its checks, computed from the run's records, all hold (the cheater's among them)
    assert not [c for c in rep["checks"] if not c["ok"]], rep["checks"]
    assert "cheater_caught[cheater-0]" in {c["name"] for c in rep["checks"]}
    assert nodes["cheater-0"]["rewards_earned"] == 0  # wiped by its hard invalidation
    assert sum(nodes[n]["rewards_claimed"] for n in ("worker-0", "worker-1")) > 0
