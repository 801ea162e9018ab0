"""How validators split a pool's files (`share`: work id mod `of`) and the rogue validator mode
(`rogue`), and the chain look-up that lets a validator re-judge a file outside its share."""

from __future__ import annotations

import os

import pytest

from meshrl.adversaries.validator import Rogue
from meshrl.pool import Check, Decision
from meshrl.protocol import EthTesterBackend
from meshrl.protocol.history import submission
from meshrl.validator.config import RogueConfig, ShareConfig, ValidatorConfig
from meshrl.wire.models import VerdictKind
from protocol.test_disputes import _court


def test_shares_cover_every_file_exactly_once_and_evenly() -> None:
    ids = [os.urandom(32) for _ in range(3000)]
    shares = [ShareConfig(index=i, of=3) for i in range(3)]
    owners = [[s.mine(w) for s in shares] for w in ids]
    assert all(sum(o) == 1 for o in owners)
    counts = [sum(o[i] for o in owners) for i in range(3)]
    assert all(900 < n < 1100 for n in counts), counts  # a keccak hash spreads them
    assert ShareConfig().mine(ids[0])  # alone, a validator judges everything


def test_audits_judge_a_fraction_of_the_other_shares_unpredictably() -> None:
    ids = [os.urandom(32) for _ in range(4000)]
    share = ShareConfig(index=0, of=2, audit=0.1)
    a, b = "0x" + "11" * 20, "0x" + "22" * 20
    others = [w for w in ids if not share.mine(w)]
    mine_a = {w for w in others if share.judges(w, a)}
    mine_b = {w for w in others if share.judges(w, b)}
    assert all(share.judges(w, a) for w in ids if share.mine(w))
    assert 0.07 < len(mine_a) / len(others) < 0.13, len(mine_a)
    assert len(mine_a & mine_b) < len(mine_a) / 3  # another key audits other files
    assert not any(ShareConfig(index=0, of=2).judges(w, a) for w in others)


def test_a_share_outside_the_split_is_refused() -> None:
    with pytest.raises(ValueError, match="index 2 not below of 2"):
        ShareConfig(index=2, of=2)
    assert ValidatorConfig().rogue.mode == "none"  # honest unless set


def test_rogue_accuses_only_the_first_honest_files() -> None:
    ok = Decision(VerdictKind.ACCEPT, "all checks passed", (), {"n": 1})
    bad = Decision(VerdictKind.HARD_INVALID, "rewards", (Check.REWARDS,))
    share = ShareConfig(index=0, of=2)
    mine, theirs = (next(bytes([b]) * 32 for b in range(256) if share.mine(bytes([b]) * 32)
                         is want) for want in (True, False))
    rogue = Rogue(RogueConfig(mode="accuse-honest", accusations=2), share)
    assert rogue(theirs, ok) is ok  # another validator's file: judged honestly
    got = [rogue(mine, d) for d in (bad, ok, ok, ok)]
    assert got[0] is bad  # a true verdict stays true
    assert [d.kind for d in got[1:]] == [VerdictKind.HARD_INVALID] * 2 + [VerdictKind.ACCEPT]
    assert "rogue validator" in got[1].reason and got[1].stats == {"n": 1}
    assert Rogue(RogueConfig())(mine, ok) is ok  # mode none: the verdict as judged


def test_submission_is_found_by_its_work_id() -> None:
    c = _court(EthTesterBackend())
    wid = c.submit(c.w.p1, c.w.n1.address, "look-me-up", 3)
    e = submission(c.w.fed, wid)
    assert e is not None and e.name == "WorkSubmitted" and bytes(e.args["work_id"]) == wid
    assert e.args["units"] == 3 and e.args["node"] == c.w.n1.address
    assert submission(c.w.fed, b"\x01" * 32) is None
