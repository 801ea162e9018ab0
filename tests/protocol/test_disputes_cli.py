"""`meshrl chain disputes | challenge | vote | settle` against a real anvil: a provider
challenges a rogue verdict, a second validator votes, anyone settles; the listing follows each
step; every refusal is one line naming the contract's reason, exit status 1."""

from __future__ import annotations

import json

import pytest

from meshrl.cli import main
from meshrl.protocol import WorkStatus

from .test_disputes import DISPUTE, VB, VOTE, _court

pytestmark = pytest.mark.anvil


def _run(capsys, *args: str) -> tuple[int, list[dict], str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.startswith("{")], err


def test_disputes_from_the_command_line(anvil_backend, tmp_path, capsys) -> None:
    c = _court(anvil_backend)
    w = c.w
    path = tmp_path / "dep.json"
    w.fed.deployment.save(path)
    common = ["--chain.rpc_url", anvil_backend.url, "--chain.deployment", str(path)]

    def as_(p) -> list[str]:
        return [*common, "--chain.private_key", "0x" + bytes(p.account.key).hex()]

    honest = c.submit(w.p1, w.n1.address, "cli-honest", 5)
    fraud = c.submit(w.p2, w.n3.address, "cli-fraud", 5)
    c.rogue.hard_invalidate(honest)
    c.rogue.hard_invalidate(fraud)
    rc, rows, _ = _run(capsys, "chain", "disputes", *common, "--pool", str(w.pool))
    assert rc == 0 and [r["work_id"] for r in rows] == [honest.hex(), fraud.hex()]
    assert all(r["outcome"] == "open" and not r["challenged"] and not r["due"] for r in rows)
    assert rows[0]["validator"] == c.rogue.address and rows[0]["hard"]

    rc, out, _ = _run(capsys, "chain", "challenge", *as_(w.p1), "--work_id", honest.hex())
    assert rc == 0 and out[0]["challenged"] and "VerdictChallenged" in out[0]["events"]
    rc, _, err = _run(capsys, "chain", "challenge", *as_(w.p1), "--work_id", fraud.hex())
    assert rc == 1 and "work: not your work" in err  # not the provider of the cheater's work
    rc, out, _ = _run(capsys, "chain", "vote", *as_(c.judge), "--work_id", fraud.hex(),
                      "--uphold", "true")
    assert rc == 0 and (out[0]["uphold"], out[0]["overturn"]) == (1, 0)
    rc, _, err = _run(capsys, "chain", "vote", *as_(c.judge), "--work_id", fraud.hex(),
                      "--uphold", "true")
    assert rc == 1 and "work: already voted" in err
    rc, _, err = _run(capsys, "chain", "settle", *as_(w.stranger), "--work_id", honest.hex())
    assert rc == 1 and "work: dispute open" in err
    rc, _, err = _run(capsys, "chain", "vote", *as_(c.judge), "--work_id", "0x1234")
    assert rc == 2 and "32 bytes in hex" in err  # a malformed id never reaches the chain

    stake = w.fed.provider(w.p1.address).stake
    w.backend.advance_time(max(DISPUTE, VOTE) + 1)
    rc, rows, _ = _run(capsys, "chain", "disputes", *common, "--pool", str(w.pool), "--open",
                       "true")
    assert rc == 0 and len(rows) == 2 and all(r["due"] for r in rows)
    for wid in (honest, fraud):
        rc, out, _ = _run(capsys, "chain", "settle", *as_(w.stranger), "--work_id", wid.hex())
        assert rc == 0
    # the challenge nobody upheld overturned the rogue verdict: bond to the provider, and its
    # challenge deposit back
    assert w.fed.work(honest).status == WorkStatus.SUBMITTED
    assert w.fed.provider(w.p1.address).stake == stake + VB + VB // 2
    assert w.fed.work(fraud).status == WorkStatus.HARD_INVALIDATED
    rc, rows, _ = _run(capsys, "chain", "disputes", *common, "--pool", str(w.pool))
    got = {r["work_id"]: r for r in rows}
    assert got[honest.hex()]["outcome"] == "overturned" and got[honest.hex()]["forfeited"] == VB
    assert got[fraud.hex()]["outcome"] == "upheld" and got[fraud.hex()]["slashed"] > 0
    rc, rows, _ = _run(capsys, "chain", "disputes", *common, "--pool", str(w.pool), "--open",
                       "true")
    assert rc == 0 and rows == []
