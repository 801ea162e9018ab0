"""A rogue validator's false verdict, its co-validators passive: the honest worker challenges
it by itself and wins the rogue's bond; a provider that does not watch (`challenge_verdicts =
"off"`, as every worker was before) loses the item and the slash once the unconfirmed verdict
has been open 24 dispute periods (issue 42: "a passive co-validator lets a rogue slash for
free"). Real processes: anvil, discovery, orchestrator, two `meshrl worker`s; the rogue is the
pool's validator key accusing from the test."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from meshrl.protocol import WorkStatus
from network import PARAMS, TOKEN, fund_provider, key, start_net, wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

BOND = 10 * TOKEN
GAME = PARAMS.model_copy(update={"verdict_bond": BOND, "dispute_period": 60, "vote_period": 30,
                                 "quorum": 1})


def _first_work(net, node: str) -> bytes | None:
    for e in net.fed.events(net.fed.deployment.block).poll():
        if e.name == "WorkSubmitted" and e.args["node"].lower() == node.lower():
            return bytes(e.args["work_id"])
    return None


def test_the_worker_challenges_a_false_verdict_and_wins_the_rogues_bond(tmp_path):
    net = start_net(tmp_path, params=GAME)
    try:
        rogue = net.client(key("val"))
        net.fed.mint(rogue.address, 100 * TOKEN)
        rogue.post_bond(4 * BOND)
        parties = {}
        for name, which in (("defends", "hard"), ("silent", "off")):
            provider, node, _ = fund_provider(net, name)
            w = worker(net, name, max_files=0, watch_verdicts_s=0.5, challenge_verdicts=which)
            w.start()
            parties[name] = (provider, node, w)
        wids = {}
        for name, (_, node, _) in parties.items():
            wids[name] = wait_until(lambda n=node: _first_work(net, n.address), 240)
        stakes = {n: net.fed.provider(p.address).stake for n, (p, _, _) in parties.items()}
        for wid in wids.values():  # false: nobody judged these files, the rogue accuses anyway
            rogue.hard_invalidate(wid)
        wait_until(lambda: net.fed.dispute(wids["defends"]).challenged, 60)
        log = parties["defends"][2].log.read_text()
        assert '"verdict challenged"' in log and wids["defends"].hex() in log
        assert not net.fed.dispute(wids["silent"]).challenged  # nobody speaks for it
        for _, _, w in parties.values():
            w.proc.send_signal(signal.SIGTERM)
            w.wait(60)
        # no co-validator votes; the challenged verdict ends a vote period after the challenge,
        # the silent one after 24 dispute periods
        net.fed.backend.advance_time(25 * GAME.dispute_period + GAME.vote_period)
        bond_before = rogue.bond()[0]
        for wid in wids.values():
            net.fed.settle(wid)
        assert net.fed.work(wids["defends"]).status == WorkStatus.SUBMITTED  # overturned
        assert net.fed.work(wids["silent"]).status == WorkStatus.HARD_INVALIDATED
        after = {n: net.fed.provider(p.address).stake for n, (p, _, _) in parties.items()}
        # the defender: its deposit back and the rogue's bond; the silent one: slashed
        assert after["defends"] == stakes["defends"] + BOND
        assert after["silent"] == stakes["silent"] - GAME.slash_penalty
        assert rogue.bond()[0] == bond_before - BOND  # the rogue paid for the false verdict
    finally:
        net.close()
