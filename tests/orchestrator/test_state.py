"""The ledger in SQLite without services: granted rows and claims (submissions the pool did not
grant), acceptance order, re-grants, and the upgrade of a one-row-per-file ledger."""

from __future__ import annotations

import sqlite3

from meshrl.orchestrator.state import Grant, PoolStep, SlotUse, State
from meshrl.wire.models import FileStatus

A, B = "0x" + "aa" * 20, "0x" + "bb" * 20
X, Y = "11" * 32, "22" * 32


def _grant(s: State, sha: str, node: str = A, slot: str = "s1", expires: float = 1e12,
           counter: int | None = None) -> bool:
    counter = int(sha[:2], 16) % 8 if counter is None else counter  # one per file by default
    return s.grant_slot(slot, node, "0xprov", sha, 100, 3, 2, 50, counter,
                        expires) is Grant.GRANTED


def test_claims_are_rows_of_their_own_and_acceptance_orders_the_feed(tmp_path) -> None:
    s = State(tmp_path / "o.db")
    assert _grant(s, X) and _grant(s, Y, slot="s2")
    s.finish_upload("s1", X)
    s.finish_upload("s2", Y)
    copy = s.add_claim(X, B, "0xother", 50, "cc" * 32, fallback_step=9)
    unknown = s.add_claim("33" * 32, B, "0xother", 7, "dd" * 32, fallback_step=9)
    assert (copy.granted, copy.uploaded, copy.step, copy.policy_version, copy.size) == (
        False, False, 3, 2, 100)  # the granted file's, same bytes
    assert (unknown.step, unknown.policy_version, unknown.status) == (9, -1,
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
    rows = [(X, "accepted", "w1"), (Y, "granted", ""), ("33" * 32, "accepted", "w3")]
    for sha, status, wid in rows:
        db.execute("INSERT INTO files (sha256, node, provider, step, policy_version, "
                   "work_units, size, status, updated_at, work_id) VALUES "
                   "(?, ?, 'p', 1, 1, 5, 9, ?, 0, ?)", (sha, A, status, wid))
    db.commit()
    db.close()
    s = State(tmp_path / "old.db")
    got = s.files(None, None, 0, 10)
    assert [(r.seq, r.sha256, r.granted, r.uploaded, r.accepted_seq, r.work_id) for r in got] \
        == [(1, X, True, True, 1, "w1"), (2, Y, True, False, 0, ""),
            (3, "33" * 32, True, True, 3, "w3")]
    s.add_claim(X, B, "p", 5, "w4", 0)  # the new layout's rows work
    assert len(s.files(None, None, 0, 10, sha256=X)) == 2
    s.close()
    assert len(State(tmp_path / "old.db").files(None, None, 0, 10)) == 4  # reopened as is


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
