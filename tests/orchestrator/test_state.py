"""The ledger in SQLite without services: granted rows and claims (submissions the pool did not
grant), acceptance order, re-grants, and the upgrade of a one-row-per-file ledger."""

from __future__ import annotations

import sqlite3

import pytest

from meshrl.cli import main
from meshrl.orchestrator.state import Grant, LedgerUnreadable, PoolStep, SlotUse, State
from meshrl.wire.models import MAX_REASON, FileStatus, VerdictKind

A, B = "0x" + "aa" * 20, "0x" + "bb" * 20
X, Y = "11" * 32, "22" * 32


def _grant(s: State, sha: str, node: str = A, slot: str = "s1", expires: float = 1e12,
           counter: int | None = None) -> bool:
    counter = int(sha[:2], 16) % 8 if counter is None else counter  # one per file by default
    return s.grant_slot(slot, node, "0xprov", sha, 100, 2, 50, counter,
                        expires) is Grant.GRANTED


def test_claims_are_rows_of_their_own_and_acceptance_orders_the_feed(tmp_path) -> None:
    s = State(tmp_path / "o.db")
    assert _grant(s, X) and _grant(s, Y, slot="s2")
    s.finish_upload("s1", X)
    s.finish_upload("s2", Y)
    copy = s.add_claim(X, B, "0xother", 50, "cc" * 32)
    unknown = s.add_claim("33" * 32, B, "0xother", 7, "dd" * 32)
    assert (copy.granted, copy.uploaded, copy.policy_version, copy.size) == (
        False, False, 2, 100)  # the granted file's, same bytes
    assert (unknown.policy_version, unknown.size, unknown.status) == (-1, 0,
                                                                       FileStatus.SUBMITTED)
    assert s.file(X).node == A  # the granted row  # type: ignore[union-attr]
    assert [r.node for r in s.files(None, None, 0, 10, sha256=X)] == [A, B]
    assert not _grant(s, X, slot="s3")  # granted and live
    assert not _grant(s, "33" * 32, node=B, slot="s4")  # B already submitted it on chain
    y = s.file(Y)
    s.set_file_status(copy.seq, FileStatus.ACCEPTED)
    s.set_file_status(y.seq, FileStatus.ACCEPTED)  # type: ignore[union-attr]
    s.set_file_status(copy.seq, FileStatus.ACCEPTED)  # again: keeps its place
    feed = s.accepted(0, 10)
    assert [(r.sha256, r.node, r.accepted_seq) for r in feed] == [(X, B, 1), (Y, A, 2)]
    assert [r.sha256 for r in s.accepted(1, 10)] == [Y]
    s.set_file_status(copy.seq, FileStatus.HARD_INVALIDATED)  # the chain overrides
    assert [r.sha256 for r in s.accepted(0, 10)] == [Y]
    s.close()


def test_expired_grant_is_granted_afresh(tmp_path) -> None:
    s = State(tmp_path / "o.db")
    assert _grant(s, X, expires=1.0)
    assert s.expire_slots(now=2.0) == 1 and s.file(X).status == FileStatus.EXPIRED  # type: ignore
    assert _grant(s, X, node=B, slot="s2")
    row = s.file(X)
    assert (row.node, row.status, row.uploaded) == (B, FileStatus.GRANTED, False)  # type: ignore
    assert len(s.files(None, None, 0, 10)) == 1
    s.close()


def test_a_one_row_per_file_ledger_is_upgraded(tmp_path) -> None:
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("""
        CREATE TABLE files (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT UNIQUE NOT NULL,
            node TEXT NOT NULL, provider TEXT NOT NULL, step INTEGER NOT NULL,
            policy_version INTEGER NOT NULL, work_units INTEGER NOT NULL, size INTEGER NOT NULL,
            status TEXT NOT NULL, verdict TEXT NOT NULL DEFAULT '',
            validator TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL,
            work_id TEXT NOT NULL DEFAULT '');
        CREATE INDEX files_step ON files (step, status);
        CREATE INDEX files_work ON files (work_id);""")
    rows = [(X, "accepted", "w1", "accept"), (Y, "granted", "", ""),
            ("33" * 32, "accepted", "w3", "soft_invalid: rewards: 1 of 8 rows differ")]
    for sha, status, wid, verdict in rows:
        db.execute("INSERT INTO files (sha256, node, provider, step, policy_version, "
                   "work_units, size, status, updated_at, work_id, verdict) VALUES "
                   "(?, ?, 'p', 1, 1, 5, 9, ?, 0, ?, ?)", (sha, A, status, wid, verdict))
    db.commit()
    db.close()
    s = State(tmp_path / "old.db")
    got = s.files(None, None, 0, 10)
    assert [(r.seq, r.sha256, r.granted, r.uploaded, r.accepted_seq, r.work_id) for r in got] \
        == [(1, X, True, True, 1, "w1"), (2, Y, True, False, 0, ""),
            (3, "33" * 32, True, True, 3, "w3")]
    assert [(r.verdict, r.verdict_reason) for r in got] == [
        (VerdictKind.ACCEPT, ""), (None, ""),
        (VerdictKind.SOFT_INVALID, "rewards: 1 of 8 rows differ")]
    s.add_claim(X, B, "p", 5, "w4")  # the new layout's rows work
    assert len(s.files(None, None, 0, 10, sha256=X)) == 2
    s.close()
    assert len(State(tmp_path / "old.db").files(None, None, 0, 10)) == 4  # reopened as is


# the files table of the ledger before batches and granted counters, whose `verdict` held
# "kind: reason" text (orchestrator/api.py wrote f"{kind}: {reason}", an accept's kind alone)
_TEXT_VERDICTS = """
    CREATE TABLE files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT NOT NULL, node TEXT NOT NULL,
        provider TEXT NOT NULL, step INTEGER NOT NULL, policy_version INTEGER NOT NULL,
        work_units INTEGER NOT NULL, size INTEGER NOT NULL, status TEXT NOT NULL,
        verdict TEXT NOT NULL DEFAULT '', validator TEXT NOT NULL DEFAULT '',
        updated_at REAL NOT NULL, work_id TEXT NOT NULL DEFAULT '',
        granted INTEGER NOT NULL DEFAULT 1, uploaded INTEGER NOT NULL DEFAULT 0,
        accepted_seq INTEGER NOT NULL DEFAULT 0);
    CREATE UNIQUE INDEX files_granted ON files (sha256) WHERE granted = 1;
    CREATE UNIQUE INDEX files_claimed ON files (sha256, node) WHERE granted = 0;"""


def _text_verdict_ledger(path, verdicts: list[tuple[str, str]]) -> None:
    db = sqlite3.connect(path)
    db.executescript(_TEXT_VERDICTS)
    for i, (status, verdict) in enumerate(verdicts):
        db.execute("INSERT INTO files (sha256, node, provider, step, policy_version, work_units, "
                   "size, status, verdict, validator, updated_at, work_id, uploaded, "
                   "accepted_seq) VALUES (?, ?, 'p', 2, 2, 5, 9, ?, ?, ?, 0, ?, 1, ?)",
                   (f"{i + 1:064x}", A, status, verdict, B if verdict else "", f"{i + 100:064x}",
                    i + 1 if status == "accepted" else 0))
    db.commit()
    db.close()


def test_a_ledger_of_text_verdicts_is_split_into_kind_and_reason(tmp_path) -> None:
    """A network resumed from a run whose ledger held "kind: reason" text keeps its verdicts:
    the upgrade splits each into the kind and the reason (a reason may hold ": " itself), a
    row never judged stays unjudged, and every other column is where it was."""
    why = "prompts: row 3 is not the assigned problem"
    long = "rewards: " + "x" * (MAX_REASON - len("rewards: "))
    _text_verdict_ledger(tmp_path / "old.db", [
        ("accepted", "accept"),
        ("submitted", ""),
        ("hard_invalidated", f"hard_invalid: {why}"),
        ("soft_invalidated", "soft_invalid: rewards: 1 of 8 rows differ"),
        ("hard_invalidated", "hard_invalid: "),  # a verdict posted with no reason
        ("submitted", f"soft_invalid: {long}"),  # the longest reason the wire let through
        ("accepted", "soft_invalid: accused after the trainer took it")])
    s = State(tmp_path / "old.db")
    got = s.files(None, None, 0, 10)
    assert [(r.status.value, r.verdict, r.verdict_reason) for r in got] == [
        ("accepted", VerdictKind.ACCEPT, ""),
        ("submitted", None, ""),
        ("hard_invalidated", VerdictKind.HARD_INVALID, why),
        ("soft_invalidated", VerdictKind.SOFT_INVALID, "rewards: 1 of 8 rows differ"),
        ("hard_invalidated", VerdictKind.HARD_INVALID, ""),
        ("submitted", VerdictKind.SOFT_INVALID, long),
        ("accepted", VerdictKind.SOFT_INVALID, "accused after the trainer took it")]
    assert [(r.seq, r.validator, r.work_id, r.accepted_seq, r.counter, r.batch_id)
            for r in got[:2]] == [(1, B, f"{100:064x}", 1, -1, ""),
                                  (2, "", f"{101:064x}", 0, -1, "")]
    assert [r.sha256 for r in s.accepted(0, 10)] == [f"{1:064x}", f"{7:064x}"]
    # the upgraded ledger takes verdicts as the new layout does, its reason bounded
    s.set_file_status(2, FileStatus.SUBMITTED, verdict=VerdictKind.HARD_INVALID,
                      reason="z" * (MAX_REASON + 100), validator=B)
    row = s.files(None, None, 1, 1)[0]
    assert (row.verdict, row.verdict_reason) == (VerdictKind.HARD_INVALID, "z" * MAX_REASON)
    s.set_file_status(2, FileStatus.HARD_INVALIDATED)  # the chain's event keeps the verdict
    assert s.files(None, None, 1, 1)[0].verdict_reason == "z" * MAX_REASON
    s.close()
    again = State(tmp_path / "old.db")  # reopened: nothing split twice
    assert [(r.verdict, r.verdict_reason) for r in again.files(None, None, 2, 2)] == [
        (VerdictKind.HARD_INVALID, why),
        (VerdictKind.SOFT_INVALID, "rewards: 1 of 8 rows differ")]
    again.close()


def test_a_verdict_text_no_version_wrote_stops_the_upgrade_unchanged(tmp_path, capsys) -> None:
    """Text that is no "kind: reason" is not guessed at: the upgrade refuses and rolls back,
    so the old ledger is as it was (nothing half split)."""
    _text_verdict_ledger(tmp_path / "old.db", [("accepted", "accept"),
                                               ("submitted", "fraud: a kind nobody posts")])
    with pytest.raises(LedgerUnreadable, match="not 'kind: reason'"):
        State(tmp_path / "old.db")
    # `meshrl orchestrator` on that ledger: one line naming the row, exit 1, before the chain
    # is asked (its deployment file does not exist), no traceback
    code = main(["orchestrator", "--db", str(tmp_path / "old.db"), "--chain.deployment",
                 str(tmp_path / "nodeploy.json"), "--chain.rpc_url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert code == 1 and "Traceback" not in err, err
    assert lines == ["meshrl orchestrator: ledger row 2: verdict 'fraud: a kind nobody posts' "
                     "is not 'kind: reason'"], err
    db = sqlite3.connect(tmp_path / "old.db")
    assert "verdict_reason" not in [r[1] for r in db.execute("PRAGMA table_info(files)")]
    assert [r[0] for r in db.execute("SELECT verdict FROM files ORDER BY seq")] == [
        "accept", "fraud: a kind nobody posts"]
    db.close()


# the files table of the ledger before issue #44: a `step` beside `policy_version` (equal on
# every granted row; a submission without grant held the pool's step and version -1), the
# counters unique per (node, step)
_STEPPED = """
    CREATE TABLE files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT NOT NULL, node TEXT NOT NULL,
        provider TEXT NOT NULL, step INTEGER NOT NULL, policy_version INTEGER NOT NULL,
        work_units INTEGER NOT NULL, size INTEGER NOT NULL, status TEXT NOT NULL,
        verdict TEXT NOT NULL DEFAULT '', verdict_reason TEXT NOT NULL DEFAULT '',
        validator TEXT NOT NULL DEFAULT '',
        updated_at REAL NOT NULL, work_id TEXT NOT NULL DEFAULT '',
        granted INTEGER NOT NULL DEFAULT 1, uploaded INTEGER NOT NULL DEFAULT 0,
        accepted_seq INTEGER NOT NULL DEFAULT 0, counter INTEGER NOT NULL DEFAULT -1,
        batch_id TEXT NOT NULL DEFAULT '');
    CREATE UNIQUE INDEX files_granted ON files (sha256) WHERE granted = 1;
    CREATE UNIQUE INDEX files_claimed ON files (sha256, node) WHERE granted = 0;
    CREATE INDEX files_step ON files (step, status);
    CREATE INDEX files_work ON files (work_id);
    CREATE INDEX files_accepted ON files (accepted_seq);
    CREATE INDEX files_status ON files (status, node);
    CREATE UNIQUE INDEX files_counter ON files (node, step, counter)
        WHERE granted = 1 AND counter >= 0;
    CREATE INDEX files_batch ON files (batch_id);"""


def _stepped_ledger(path, rows: list[tuple[str, str, int, int, int, int]]) -> None:
    """(sha256, node, step, version, counter, granted) rows, accepted ones in order."""
    db = sqlite3.connect(path)
    db.executescript(_STEPPED)
    for i, (sha, node, step, version, counter, granted) in enumerate(rows):
        db.execute("INSERT INTO files (sha256, node, provider, step, policy_version, work_units, "
                   "size, status, verdict, updated_at, work_id, granted, uploaded, accepted_seq, "
                   "counter) VALUES (?, ?, 'p', ?, ?, 5, 9, 'accepted', 'accept', 0, ?, ?, 1, ?, "
                   "?)", (sha, node, step, version, f"{i + 100:064x}", granted, i + 1, counter))
    db.commit()
    db.close()


def test_a_ledger_with_a_step_beside_the_version_is_upgraded(tmp_path) -> None:
    """A ledger whose rows kept `step` beside `policy_version` opens (issue #44): each row
    keeps its version, counter and order; the counters are then one file per (node,
    version), a fresh grant works, and a reopen changes nothing."""
    _stepped_ledger(tmp_path / "old.db", [(X, A, 2, 2, 0, 1), (Y, A, 3, 3, 0, 1),
                                          ("33" * 32, B, 4, -1, -1, 0)])
    s = State(tmp_path / "old.db")
    cols = [r[1] for r in s.db.execute("PRAGMA table_info(files)")]
    assert "step" not in cols and "policy_version" in cols
    got = s.files(None, None, 0, 10)
    assert [(r.seq, r.sha256, r.node, r.policy_version, r.counter, r.granted, r.accepted_seq,
             r.verdict) for r in got] == [
        (1, X, A, 2, 0, True, 1, VerdictKind.ACCEPT), (2, Y, A, 3, 0, True, 2,
                                                       VerdictKind.ACCEPT),
        (3, "33" * 32, B, -1, -1, False, 3, VerdictKind.ACCEPT)]
    assert [r.sha256 for r in s.files(3, None, 0, 10)] == [Y]  # by version
    assert s.granted_count(A, 2) == 1 and s.granted_count(A, 4) == 0
    # version 2's counter 0 is used; counter 1 of it and counter 0 of version 4 are free
    assert s.grant_slot("s1", A, "p", "44" * 32, 10, 2, 5, 0, 1e12) is Grant.COUNTER_USED
    assert s.grant_slot("s1", A, "p", "44" * 32, 10, 2, 5, 1, 1e12) is Grant.GRANTED
    assert s.grant_slot("s2", A, "p", "55" * 32, 10, 4, 5, 0, 1e12) is Grant.GRANTED
    with pytest.raises(sqlite3.IntegrityError):  # the index is per (node, version, counter)
        s.db.execute("INSERT INTO files (sha256, node, provider, policy_version, work_units, "
                     "size, status, updated_at, counter) VALUES (?, ?, 'p', 2, 1, 1, "
                     "'granted', 0, 1)", ("66" * 32, A))
    s.close()
    again = State(tmp_path / "old.db")
    assert len(again.files(None, None, 0, 10)) == 5
    again.close()


def test_a_stepped_ledger_whose_counters_clash_by_version_is_refused_unchanged(tmp_path):
    """Two granted files of one (node, version, counter) under different steps (a ledger from
    before a file's step was its version): refused, the old table left as it was."""
    _stepped_ledger(tmp_path / "old.db", [(X, A, 2, 2, 0, 1), (Y, A, 3, 2, 0, 1)])
    with pytest.raises(LedgerUnreadable, match="two granted files"):
        State(tmp_path / "old.db")
    db = sqlite3.connect(tmp_path / "old.db")
    assert "step" in [r[1] for r in db.execute("PRAGMA table_info(files)")]
    assert db.execute("SELECT COUNT(*) FROM files").fetchone()[0] == 2
    db.close()


def test_named_rows_invites_slot_use_and_the_pool_step(tmp_path) -> None:
    s = State(tmp_path / "o.db")
    s.put_invite(A, "0xprov", 7, 1_000, "0xsig")
    inv = s.invite(A)
    assert (inv.node, inv.provider, inv.nonce, inv.expiry, inv.signature) == (  # type: ignore
        A, "0xprov", 7, 1_000, "0xsig")
    assert s.invite(B) is None
    assert _grant(s, X)
    assert s.slot("s1").used is SlotUse.FREE  # type: ignore[union-attr]
    assert s.claim_slot("s1") and not s.claim_slot("s1")  # one upload at a time
    assert s.slot("s1").used is SlotUse.UPLOADING  # type: ignore[union-attr]
    s.release_slot("s1")  # a failed upload gives it back
    assert s.claim_slot("s1")
    s.finish_upload("s1", X)
    assert s.slot("s1").used is SlotUse.DONE  # type: ignore[union-attr]
    assert s.count_files() == {FileStatus.UPLOADED: 1}
    step = PoolStep(s, initial=3, async_level=2)
    assert (step.step, step.versions()) == (3, [1, 2, 3])
    step.set(5)
    s.close()
    again = State(tmp_path / "o.db")  # a restart resumes the step, not the configured one
    assert PoolStep(again, initial=3, async_level=2).versions() == [3, 4, 5]
