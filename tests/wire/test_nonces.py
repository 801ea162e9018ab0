"""SqliteNonceStore: seen nonces survive a reopen of the database (a restarted service), expire
with their window, are pruned from the table, and a store that cannot record refuses to serve."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from meshrl.wire import (
    ErrorCode,
    GuardConfig,
    RequestGuard,
    SqliteNonceStore,
    WireError,
    sign_request,
)

KEY = "0x" + "aa" * 32
NOW = 1_000_000


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def rows(path: Path) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT expiry, address, nonce FROM request_nonces "
                          "ORDER BY expiry").fetchall()


def guard(db: sqlite3.Connection, now: float = NOW) -> RequestGuard:
    return RequestGuard(GuardConfig(), clock=lambda: now,
                        nonces=SqliteNonceStore(db, now=now))


def signed(**kw: object) -> dict:
    kw.setdefault("timestamp", NOW)
    return sign_request(KEY, "POST", "/x", b"{}", **kw).as_dict()  # type: ignore[arg-type]


def test_nonces_survive_a_reopen_until_their_expiry(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteNonceStore(connect(path), now=NOW)
    store.add("0xA", "n1", NOW + 10)
    store.add("0xA", "n2", NOW + 20)
    store.add("0xB", "n1", NOW + 30)
    store.db.close()  # nothing flushed on purpose: every add committed by itself
    again = SqliteNonceStore(connect(path), now=NOW + 15)
    assert len(again) == 2  # n1 of 0xA expired before the reopen and was pruned
    assert [r[1:] for r in rows(path)] == [("0xA", "n2"), ("0xB", "n1")]
    assert again.seen("0xA", "n2", NOW + 15) and again.seen("0xB", "n1", NOW + 15)
    assert not again.seen("0xA", "n1", NOW + 15)
    assert not again.seen("0xA", "n2", NOW + 21)  # its window closed: the nonce may come again


def test_expired_rows_are_pruned_at_most_every_prune_interval(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteNonceStore(connect(path), now=NOW, prune_every_s=30)
    for i in range(5):
        store.add("0xA", f"nonce{i}", NOW + i)
    assert not store.seen("0xA", "nonce0", NOW + 10)  # gone from memory at once ...
    assert len(rows(path)) == 5  # ... the table waits for the next prune
    assert not store.seen("0xA", "other", NOW + 31)
    assert rows(path) == []


def test_guard_refuses_a_replay_after_restart_and_serves_a_fresh_request(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    h = signed()
    first = guard(connect(path)).check("POST", "/x", h, b"{}")
    restarted = guard(connect(path), now=NOW + 5)  # same database, fresh process state
    with pytest.raises(WireError) as e:
        restarted.check("POST", "/x", h, b"{}")
    assert (e.value.status, e.value.code) == (409, ErrorCode.REPLAYED_NONCE)
    fresh = restarted.check("POST", "/x", signed(timestamp=NOW + 5), b"{}")
    assert fresh.address == first.address and fresh.nonce != first.nonce
    assert sorted(r[0] for r in rows(path)) == [NOW + 301, NOW + 306]


def test_a_refused_request_writes_no_nonce(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    g = guard(connect(path))
    with pytest.raises(WireError):
        g.check("POST", "/x", signed(timestamp=NOW - 400), b"{}")
    with pytest.raises(WireError):
        g.check("POST", "/x", signed(), b"{tampered}")
    assert rows(path) == [] and len(g.nonces) == 0


def test_a_store_that_cannot_record_refuses_to_serve(tmp_path: Path) -> None:
    db = connect(tmp_path / "state.db")
    g = guard(db)
    db.close()
    with pytest.raises(WireError) as e:
        g.check("POST", "/x", signed(), b"{}")
    assert (e.value.status, e.value.code) == (503, ErrorCode.NONCE_STORE_UNAVAILABLE)
    assert len(g.nonces) == 0  # not remembered either: the table is the truth


def test_a_connection_with_implicit_transactions_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="autocommit"):
        SqliteNonceStore(sqlite3.connect(tmp_path / "state.db"))
