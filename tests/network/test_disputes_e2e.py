"""Disputes in a real `meshrl network up` (anvil, every role a process), shortened: two
validators split the files, and one of them is rogue (`meshrl adversary validator`: it
hard-invalidates the first honest file of its share); a worker forges rewards from its first
file on.

Checked on chain once every verdict is settled: the rogue's accusation of honest work is
re-judged by the honest validator (the file was not in its share), overturned by its vote, and
the rogue's locked bond is now the honest provider's stake; that provider claims every reward
of its node after the lock, the overturned file's included; the cheater is still hard-
invalidated (its verdicts upheld), slashed and blacklisted, and the trainer never trained on
its files; the report counts the disputes and its checks hold."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netutil as nu
import pytest

from meshrl.network.keys import dev_account
from meshrl.protocol import Protocol, WorkStatus
from meshrl.rl.network_source import read_records

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(1500)]

TOKEN = 10**18
BOND = 10 * TOKEN  # the network's verdict_bond
BOND_VERDICTS = 32  # the network's validators.bond_verdicts
STEPS = 3
CHEAT = '{ mode = "forge-rewards", after_step = -1 }'  # dishonest from its first file
CONFIG = nu.short_network("disputes", steps=STEPS, checkpoint_every=2, top="max_minutes = 20",
                          workers=f"honest = 2\ndishonest = 1\ncheat = {CHEAT}") + """
[validators]
count = 2
rogue = 1
rogue_accusations = 1
"""


def _account(address: str) -> Any:
    return next(dev_account(i) for i in range(64)
                if dev_account(i).address.lower() == address.lower())


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[dict[str, Any]]:
    run = nu.run_network(tmp_path_factory.mktemp("network"), CONFIG, "disputes",
                         port_offset=20)
    root, proc = next(run)
    try:
        info, chain = nu.info(root), nu.chain(root)
        # the last verdicts settle a dispute period (60 s, + 30 s when challenged) after them,
        # cut short once each has its vote (`settled_verdicts`)
        disputes = nu.wait(lambda: nu.settled_verdicts(chain, info["pool_id"]), 300,
                           "verdicts still open", every=1.0)
        facts = {"root": root, "info": info, "disputes": disputes,
                 "events": chain.events().poll(), "ledger": nu.ledger(root),
                 "claim": _claim_honest(root, info, chain, disputes)}
        # what the tests read of the chain, read while it still answers
        facts["stake"] = {w["provider"]: chain.provider(w["provider"]).stake
                          for w in info["workers"].values()}
        facts["bond"] = {n: chain.bond(v["address"]) for n, v in info["validators"].items()}
        facts["blacklisted"] = chain.is_blacklisted(info["pool_id"],
                                                    info["workers"]["cheater-0"]["node"])
        facts["claimed"] = [chain.work(wid).status for wid in facts["claim"]["ready"]]
        proc.send_signal(signal.SIGINT)  # the report is written while the roles still answer
        assert proc.wait(400) == 0  # minutes on a loaded machine (load 27 on 2 cores: 3)
        facts["report"] = json.loads((root / "report.json").read_text())
        yield facts
    finally:
        run.close()


def _claim_honest(root: Path, info: dict[str, Any], chain: Protocol,
                  disputes: list[dict[str, Any]]) -> dict[str, Any]:
    """After the lock, the provider the rogue wronged claims every item of its node."""
    rogue = info["validators"]["validator-1"]["address"].lower()
    honest = {w["node"].lower(): w for w in info["workers"].values() if not w["dishonest"]}
    wronged = [d for d in disputes if d["validator"].lower() == rogue
               and d["node"].lower() in honest]
    assert len(wronged) == 1, disputes
    w = honest[wronged[0]["node"].lower()]
    works = [bytes(e.args["work_id"]) for e in chain.events().poll()
             if e.name == "WorkSubmitted" and e.args["node"].lower() == w["node"].lower()]
    stake = chain.provider(w["provider"]).stake
    chain.backend.advance_time(600 + 1)
    ready = [wid for wid in works if chain.claimable(wid)]
    owed = sum(chain.work(wid).reward for wid in ready)
    before = chain.balance(w["provider"])
    me = chain.as_(_account(w["provider"]))
    for i in range(0, len(ready), 64):
        me.claim(ready[i:i + 64])
    return {"worker": w, "dispute": wronged[0], "works": works, "ready": ready, "owed": owed,
            "stake": stake, "gained": chain.balance(w["provider"]) - before}


def test_rogue_verdict_overturned_and_its_bond_paid_to_the_provider(net) -> None:
    info, d, claim = net["info"], net["claim"]["dispute"], net["claim"]
    honest_v = info["validators"]["validator"]["address"].lower()
    assert d["hard"] and d["challenged"] and d["outcome"] == "overturned"
    assert (d["uphold"], d["overturn"], d["forfeited"]) == (0, 1, BOND)
    votes = [e for e in net["events"] if e.name == "VerdictVoted"
             and bytes(e.args["work_id"]).hex() == d["work_id"]]
    assert [(e.args["validator"].lower(), e.args["uphold"]) for e in votes] == [(honest_v, False)]
    # the honest validator judged it only because it was accused: not in its share
    assert int(d["work_id"], 16) % 2 == 1
    # the wronged provider: its stake plus the rogue's bond; the other honest one untouched
    assert claim["stake"] == net["stake"][claim["worker"]["provider"]] == 100 * TOKEN + BOND
    for w in info["workers"].values():
        if not w["dishonest"] and w is not claim["worker"]:
            assert net["stake"][w["provider"]] == 100 * TOKEN
    # the rogue lost one bond; nothing is left locked once every verdict is settled; the
    # honest validator's verdicts all stood
    assert net["bond"]["validator-1"] == (BOND_VERDICTS * BOND - BOND, 0)
    assert net["bond"]["validator"] == (BOND_VERDICTS * BOND, 0)


def test_the_wronged_provider_claims_every_reward_of_its_node(net) -> None:
    claim = net["claim"]
    assert claim["works"] and claim["ready"] == claim["works"]  # none wiped, none disputed
    assert bytes.fromhex(claim["dispute"]["work_id"]) in claim["ready"]
    assert claim["owed"] > 0 and claim["gained"] == claim["owed"]
    assert net["claimed"] == [WorkStatus.CLAIMED] * len(claim["ready"])
    # the overturned file was honest: never invalidated in the ledger (accepted when the honest
    # validator's verdict came after the rogue's; left `submitted`, never trained on, when an
    # audit had accepted it before: the ledger keeps the later, disputed verdict)
    ledger = net["ledger"]
    row = next(e for e in ledger.values() if e.work_id == claim["dispute"]["work_id"])
    assert row.status.value in ("accepted", "submitted")


def test_cheater_still_slashed_blacklisted_and_never_trained_on(net) -> None:
    info, events = net["info"], net["events"]
    bad = info["workers"]["cheater-0"]
    node = bad["node"].lower()
    mine = [d for d in net["disputes"] if d["node"].lower() == node]
    assert mine and all(d["hard"] and d["outcome"] == "upheld" for d in mine)
    slashed = sum(e.args["slashed"] for e in events if e.name == "WorkInvalidated"
                  and e.args["node"].lower() == node)
    assert slashed >= 50 * TOKEN and net["stake"][bad["provider"]] == 100 * TOKEN - slashed
    assert net["blacklisted"]
    records = read_records(net["root"] / "trainer" / "rollouts.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    used = [f for r in records for f in r["used"]]
    assert used and not [f for f in used if f["node"].lower() == node]
    for f in used:
        assert net["ledger"][f["sha256"]].status.value == "accepted"
    # no honest work ends invalidated
    honest = {w["node"].lower() for w in info["workers"].values() if not w["dishonest"]}
    assert not [e for e in events if e.name == "WorkInvalidated"
                and e.args["node"].lower() in honest]


def test_the_report_counts_the_disputes(net) -> None:
    rep, ds = net["report"], net["disputes"]
    c = rep["disputes"]["counts"]
    assert c["accused"] >= len(ds) and c["overturned"] == 1 and c["open"] == 0
    assert c["upheld"] == c["accused"] - 1 and c["bond_moved"] == BOND
    rogue = rep["disputes"]["validators"]["validator-1"]
    assert rogue["rogue"] and rogue["overturned"] == 1 and rogue["bond_moved"] == BOND
    assert rep["disputes"]["validators"]["validator"]["overturned"] == 0
    checks = {x["name"]: x for x in rep["checks"]}
    assert checks["honest_files_not_invalidated"]["status"] == "pass"
    assert checks["honest_files_not_invalidated"]["numbers"]["honest_accused"] == 1
    assert not [x for x in rep["checks"] if not x["ok"]], rep["checks"]
    assert "## Disputes" in (net["root"] / "report.md").read_text()
