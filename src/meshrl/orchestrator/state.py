# over 400 lines: the orchestrator's SQLite schema and every transaction on it, so each change is
#  one place
"""The orchestrator's state in SQLite (WAL): nodes, invites, upload slots, the file ledger and
the chain cursor. Every change is one transaction committed before the HTTP answer, so a
restarted orchestrator (even after `kill -9`) has everything it acknowledged.

WAL with `synchronous=NORMAL`: a committed transaction is in the WAL file (the OS's page cache)
when `commit()` returns, which survives the death of the process; only a power loss can take
the last transactions, which `synchronous=FULL` (`durable=True`) would also protect.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any

from meshrl.orchestrator.hold import Alarm
from meshrl.wire.models import MAX_REASON, FileStatus, NodeState, VerdictKind

__all__ = ["POOL_STEP", "BatchRow", "FileRow", "Grant", "InviteRow", "LedgerUnreadable", "NodeRow",
           "PoolStep", "SlotRow", "SlotUse", "State"]

POOL_STEP = "pool_step"  # meta key of the pool's step

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, state TEXT NOT NULL,
    last_seen REAL NOT NULL, policy_version INTEGER NOT NULL DEFAULT -1,
    step INTEGER NOT NULL DEFAULT 0, tokens_per_s REAL NOT NULL DEFAULT 0,
    files_pending INTEGER NOT NULL DEFAULT 0, heartbeats INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS invites (
    node TEXT PRIMARY KEY, provider TEXT NOT NULL, nonce INTEGER NOT NULL,
    expiry INTEGER NOT NULL, signature TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    slot_id TEXT PRIMARY KEY, node TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    expires_at REAL NOT NULL, used INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT NOT NULL, node TEXT NOT NULL,
    provider TEXT NOT NULL, policy_version INTEGER NOT NULL, work_units INTEGER NOT NULL,
    size INTEGER NOT NULL, status TEXT NOT NULL,
    verdict TEXT NOT NULL DEFAULT '', verdict_reason TEXT NOT NULL DEFAULT '',
    validator TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL, work_id TEXT NOT NULL DEFAULT '',
    granted INTEGER NOT NULL DEFAULT 1, uploaded INTEGER NOT NULL DEFAULT 0,
    accepted_seq INTEGER NOT NULL DEFAULT 0, counter INTEGER NOT NULL DEFAULT -1,
    batch_id TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS files_granted ON files (sha256) WHERE granted = 1;
CREATE UNIQUE INDEX IF NOT EXISTS files_claimed ON files (sha256, node) WHERE granted = 0;
CREATE INDEX IF NOT EXISTS files_version ON files (policy_version, status);
CREATE INDEX IF NOT EXISTS files_work ON files (work_id);
CREATE INDEX IF NOT EXISTS files_accepted ON files (accepted_seq);
CREATE INDEX IF NOT EXISTS files_status ON files (status, node);  -- nodes with fraud, each poll
-- one granted file per (node, policy version, counter): nothing to grind
CREATE UNIQUE INDEX IF NOT EXISTS files_counter ON files (node, policy_version, counter)
    WHERE granted = 1 AND counter >= 0;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- a node's batches (issue 46): leaves (JSON, in leaf order) once posted by the node, count and
-- units once the chain's BatchSubmitted is seen (submitted = 1)
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, node TEXT NOT NULL, root TEXT NOT NULL,
    leaves TEXT NOT NULL DEFAULT '', count INTEGER NOT NULL DEFAULT 0,
    units INTEGER NOT NULL DEFAULT 0, submitted INTEGER NOT NULL DEFAULT 0,
    posted_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS files_batch ON files (batch_id);
"""


@dataclass(frozen=True)
class NodeRow:
    address: str
    provider: str
    state: NodeState
    last_seen: float
    policy_version: int
    step: int
    tokens_per_s: float
    files_pending: int
    heartbeats: int


@dataclass(frozen=True)
class InviteRow:
    node: str
    provider: str
    nonce: int
    expiry: int  # Unix seconds
    signature: str  # 0x-hex, the manager's
    created_at: float


class SlotUse(IntEnum):
    """How far a slot's upload got (the `slots.used` column)."""

    FREE = 0
    UPLOADING = 1  # one upload holds the slot
    DONE = 2


@dataclass(frozen=True)
class SlotRow:
    slot_id: str
    node: str
    sha256: str
    size: int
    expires_at: float
    used: SlotUse


@dataclass(frozen=True)
class FileRow:
    seq: int
    sha256: str
    node: str
    provider: str
    policy_version: int  # -1: a submission of a file the pool never stored
    work_units: int
    size: int
    status: FileStatus
    verdict: VerdictKind | None  # None: no verdict posted (the `verdict` column's '')
    verdict_reason: str  # at most MAX_REASON characters
    validator: str
    updated_at: float
    work_id: str  # the chain's key of the submitted work (hex), "" until submitted
    granted: bool  # False: a submission on chain of a file this pool did not grant the node
    uploaded: bool  # the node uploaded the file through its slot
    accepted_seq: int  # acceptance order, 0 if never accepted
    counter: int  # the granted counter at its version, -1 for a submission without a grant
    batch_id: str = ""  # the batch its node put it in (hex), "" for a file submitted alone


# by name: a ledger upgraded by ALTER TABLE has its later columns in another order
_FILE_COLUMNS = ("seq, sha256, node, provider, policy_version, work_units, size, status, "
                "verdict, verdict_reason, validator, updated_at, work_id, granted, uploaded, "
                "accepted_seq, counter, batch_id")


def _file_row(r: tuple[Any, ...]) -> FileRow:
    return FileRow(*r[:7], FileStatus(r[7]), VerdictKind(r[8]) if r[8] else None, *r[9:13],
                   bool(r[13]), bool(r[14]), *r[15:18])


class LedgerUnreadable(ValueError):
    """A ledger this version cannot open as it is (text no version wrote): the orchestrator
    refuses to start, in one line, and leaves the file unchanged."""


def _split_verdicts(db: sqlite3.Connection) -> None:
    """A ledger from before verdicts were columns held "kind: reason" (an accept: "kind"
    alone) in `verdict`: split into the kind and the reason (cut to MAX_REASON). Text no
    version wrote is refused, so the upgrade rolls back rather than guess."""
    kinds = {k.value for k in VerdictKind}
    split = []
    for seq, text in db.execute("SELECT seq, verdict FROM files WHERE verdict != ''"):
        kind, _, reason = text.partition(": ")
        if kind not in kinds:
            raise LedgerUnreadable(f"ledger row {seq}: verdict {text[:80]!r} is not 'kind: reason'")
        split.append((kind, reason[:MAX_REASON], seq))
    db.executemany("UPDATE files SET verdict = ?, verdict_reason = ? WHERE seq = ?", split)


@dataclass(frozen=True)
class BatchRow:
    batch_id: str
    node: str
    root: str
    leaves: str  # JSON list of leaves ({sha256, work_units, step, counter}), "" until posted
    count: int  # from BatchSubmitted, 0 until seen
    units: int
    submitted: bool


class Grant(Enum):
    """What became of a request for an upload slot."""

    GRANTED = "granted"  # a fresh slot (for a new file, or again for this node's unstored one)
    UPLOADED = "uploaded"  # this node's file is stored already: nothing to upload
    KNOWN = "known"  # another node's live file, or one this node submitted without a grant
    COUNTER_USED = "counter_used"  # this node was granted another file at (version, counter)


class State:
    """One SQLite connection used from the event loop's thread (each call is short).

    `alarm` is rung after each committed change a held request may wait for (hold.py): a
    transaction, a file's status, a meta value (the trainer's demand), a node's version.
    `files_alarm` only after a change of the file ledger (a transaction, a file's status): held
    ledger reads wait on it, so heartbeats do not wake them."""

    def __init__(self, path: str | Path, durable: bool = False) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.alarm = Alarm()
        self.files_alarm = Alarm()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        old = self._columns("files")
        if old and "granted" not in old:
            self._migrate_files()
        if old and "counter" not in self._columns("files"):  # from before counters were granted
            self.db.execute("ALTER TABLE files ADD COLUMN counter INTEGER NOT NULL DEFAULT -1")
        if old and "batch_id" not in self._columns("files"):  # from before batches
            self.db.execute("ALTER TABLE files ADD COLUMN batch_id TEXT NOT NULL DEFAULT ''")
        if old and "verdict_reason" not in self._columns("files"):  # "kind: reason" text
            with self.tx() as db:  # one transaction: no restart finds the column unsplit
                db.execute("ALTER TABLE files ADD COLUMN verdict_reason TEXT NOT NULL "
                           "DEFAULT ''")
                _split_verdicts(db)
        if old and "step" in self._columns("files"):  # a file's step beside its version
            self._drop_file_step()
        self.db.executescript(SCHEMA)

    def _columns(self, table: str) -> list[str]:
        return [r[1] for r in self.db.execute(f"PRAGMA table_info({table})")]

    def _migrate_files(self) -> None:
        """A ledger of the one-row-per-sha256 layout: every row was a grant; accepted rows keep
        their ledger order as acceptance order."""
        cols = ", ".join(c for c in self._columns("files") if c != "step")  # = policy_version
        with self.tx() as db:
            db.execute("ALTER TABLE files RENAME TO files_v1")
            for index in ("files_step", "files_work"):
                db.execute(f"DROP INDEX IF EXISTS {index}")
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            db.execute(f"INSERT INTO files ({cols}) SELECT {cols} FROM files_v1")
            _split_verdicts(db)
            db.execute("UPDATE files SET uploaded = status NOT IN (?, ?)",
                       (FileStatus.GRANTED.value, FileStatus.EXPIRED.value))
            db.execute("UPDATE files SET accepted_seq = seq WHERE status = ?",
                       (FileStatus.ACCEPTED.value,))
            db.execute("DROP TABLE files_v1")

    def _drop_file_step(self) -> None:
        """A ledger whose rows kept a `step` beside `policy_version` (issue #44): the table is
        rebuilt without it, the counters' uniqueness now per (node, version). A granted row's
        step was its version (the grant refused any other); a submission without grant held
        the pool's step with version -1, and keeps its -1. Two granted rows of one (node,
        version, counter) (only a ledger from before a file's step was its version can hold
        them) make the ledger unreadable, unchanged."""
        cols = ", ".join(c for c in self._columns("files") if c != "step")
        with self.tx() as db:
            db.execute("ALTER TABLE files RENAME TO files_stepped")
            for (index,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                       "AND tbl_name = 'files_stepped' AND sql IS NOT NULL"
                                       ).fetchall():
                db.execute(f"DROP INDEX {index}")  # names are global: the new table's own
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            try:
                db.execute(f"INSERT INTO files ({cols}) SELECT {cols} FROM files_stepped")
            except sqlite3.IntegrityError:
                raise LedgerUnreadable("ledger has two granted files of one (node, policy "
                                       "version, counter)") from None
            db.execute("DROP TABLE files_stepped")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        self.alarm.ring()
        self.files_alarm.ring()

    # meta
    def get_meta(self, key: str, default: str = "") -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def set_meta(self, key: str, value: str, db: sqlite3.Connection | None = None) -> None:
        (db or self.db).execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                                "SET value = excluded.value", (key, value))
        if db is None:  # inside a transaction the commit rings
            self.alarm.ring()

    # nodes
    def node(self, address: str) -> NodeRow | None:
        row = self.db.execute("SELECT * FROM nodes WHERE address = ?", (address,)).fetchone()
        return None if row is None else NodeRow(*row[:2], NodeState(row[2]), *row[3:])

    def nodes(self, states: tuple[NodeState, ...] = tuple(NodeState)) -> list[NodeRow]:
        marks = ",".join("?" * len(states))
        rows = self.db.execute(f"SELECT * FROM nodes WHERE state IN ({marks}) ORDER BY address",
                               [s.value for s in states])
        return [NodeRow(*r[:2], NodeState(r[2]), *r[3:]) for r in rows]

    def upsert_node(self, address: str, provider: str, state: NodeState, now: float) -> None:
        self.db.execute(
            "INSERT INTO nodes (address, provider, state, last_seen) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(address) DO UPDATE SET provider = excluded.provider, "
            "state = excluded.state, last_seen = excluded.last_seen",
            (address, provider, state.value, now))

    def set_node_state(self, address: str, state: NodeState) -> None:
        self.db.execute("UPDATE nodes SET state = ? WHERE address = ?", (state.value, address))

    def heartbeat(self, address: str, now: float, policy_version: int, step: int,
                  tokens_per_s: float, files_pending: int) -> None:
        self.db.execute(
            "UPDATE nodes SET last_seen = ?, state = ?, policy_version = ?, step = ?, "
            "tokens_per_s = ?, files_pending = ?, heartbeats = heartbeats + 1 WHERE address = ?",
            (now, NodeState.HEALTHY.value, policy_version, step, tokens_per_s, files_pending,
             address))
        self.alarm.ring()

    def set_policy_version(self, address: str, policy_version: int) -> None:
        """The version a node says it holds now (with its work order: fresher than its last
        heartbeat's, which pacing would otherwise judge it by)."""
        self.db.execute("UPDATE nodes SET policy_version = ? WHERE address = ?",
                        (policy_version, address))
        self.alarm.ring()

    def grace(self, now: float) -> int:
        """After a restart: every live node's miss clock starts again (downtime is ours)."""
        live = (NodeState.HEALTHY.value, NodeState.UNHEALTHY.value)
        cur = self.db.execute("UPDATE nodes SET last_seen = MAX(last_seen, ?) "
                              "WHERE state IN (?, ?)", (now, *live))
        return cur.rowcount

    # invites
    def invite(self, node: str) -> InviteRow | None:
        row = self.db.execute("SELECT node, provider, nonce, expiry, signature, created_at "
                              "FROM invites WHERE node = ?", (node,)).fetchone()
        return None if row is None else InviteRow(*row)

    def put_invite(self, node: str, provider: str, nonce: int, expiry: int, sig: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO invites VALUES (?, ?, ?, ?, ?, ?)",
                        (node, provider, nonce, expiry, sig, time.time()))

    def drop_invite(self, node: str) -> None:
        self.db.execute("DELETE FROM invites WHERE node = ?", (node,))

    # slots and files
    def slot(self, slot_id: str) -> SlotRow | None:
        row = self.db.execute("SELECT * FROM slots WHERE slot_id = ?", (slot_id,)).fetchone()
        return None if row is None else SlotRow(*row[:5], SlotUse(row[5]))

    def file(self, sha256: str) -> FileRow | None:
        """The granted row of a file (the one that may be trained on)."""
        row = self.db.execute(f"SELECT {_FILE_COLUMNS} FROM files WHERE sha256 = ? AND "
                              "granted = 1", (sha256,)).fetchone()
        return None if row is None else _file_row(row)

    def file_by_work_id(self, work_id: str) -> FileRow | None:
        row = self.db.execute(f"SELECT {_FILE_COLUMNS} FROM files WHERE work_id = ?",
                              (work_id,)).fetchone()
        return None if row is None else _file_row(row)

    def files(self, version: int | None, status: FileStatus | None, after: int, limit: int,
              sha256: str | None = None, work_id: str | None = None) -> list[FileRow]:
        sql, args = f"SELECT {_FILE_COLUMNS} FROM files WHERE seq > ?", [after]
        for column, value in (("sha256", sha256), ("work_id", work_id),
                              ("policy_version", version),
                              ("status", None if status is None else status.value)):
            if value is not None:
                sql, args = sql + f" AND {column} = ?", [*args, value]
        rows = self.db.execute(sql + " ORDER BY seq LIMIT ?", [*args, limit])
        return [_file_row(r) for r in rows]

    def nodes_with(self, status: FileStatus) -> list[str]:
        """Nodes that have at least one row in `status`."""
        rows = self.db.execute("SELECT DISTINCT node FROM files WHERE status = ? ORDER BY node",
                               (status.value,))
        return [r[0] for r in rows]

    def accepted(self, after: int, limit: int) -> list[FileRow]:
        """Accepted rows in the order they were accepted, after acceptance number `after`."""
        rows = self.db.execute(f"SELECT {_FILE_COLUMNS} FROM files WHERE status = ? AND "
                               "accepted_seq > ? ORDER BY accepted_seq LIMIT ?",
                               (FileStatus.ACCEPTED.value, after, limit))
        return [_file_row(r) for r in rows]

    def last_accepted_seq(self) -> int:
        """The highest acceptance number given so far (0: none); a row keeps its number
        after a later invalidation."""
        row = self.db.execute("SELECT COALESCE(MAX(accepted_seq), 0) FROM files").fetchone()
        return int(row[0])

    def set_file_status(self, seq: int, status: FileStatus, db: sqlite3.Connection | None = None,
                        verdict: VerdictKind | None = None, reason: str = "",
                        validator: str | None = None) -> None:
        """Move one row; its first acceptance gives it the next acceptance number (one
        statement, so no crash can leave an accepted row without its number). A `verdict`
        replaces the row's verdict and reason (cut to MAX_REASON); None keeps both."""
        kind = None if verdict is None else verdict.value
        (db or self.db).execute(
            "UPDATE files SET status = ?, verdict = COALESCE(?, verdict), "
            "verdict_reason = CASE WHEN ? IS NULL THEN verdict_reason ELSE ? END, "
            "validator = COALESCE(?, validator), updated_at = ?, accepted_seq = CASE "
            "WHEN ? AND accepted_seq = 0 THEN (SELECT COALESCE(MAX(accepted_seq), 0) + 1 "
            "FROM files) ELSE accepted_seq END WHERE seq = ?",
            (status.value, kind, kind, reason[:MAX_REASON], validator, time.time(),
             status is FileStatus.ACCEPTED, seq))
        if db is None:  # inside a transaction the commit rings
            self.alarm.ring()
            self.files_alarm.ring()

    def grant_slot(self, slot_id: str, node: str, provider: str, sha256: str, size: int,
                   policy_version: int, work_units: int, counter: int,
                   expires_at: float) -> Grant:
        """A slot for the file and its granted row. The same node asking again for a file it
        has not stored gets a fresh slot (its old ones are dropped), so an upload cut by a crash
        of either side can always be finished, once; a stored file is `UPLOADED`."""
        with self.tx() as db:
            claimed = db.execute("SELECT 1 FROM files WHERE sha256 = ? AND node = ? AND "
                                 "granted = 0", (sha256, node)).fetchone()
            if claimed:
                return Grant.KNOWN
            old = db.execute("SELECT seq, status, node, uploaded FROM files WHERE sha256 = ? "
                             "AND granted = 1", (sha256,)).fetchone()
            if old is not None:
                mine = old[2] == node
                if mine and old[3]:
                    return Grant.UPLOADED
                if not mine and FileStatus(old[1]) is not FileStatus.EXPIRED:
                    return Grant.KNOWN
            other = db.execute("SELECT 1 FROM files WHERE granted = 1 AND node = ? AND "
                               "policy_version = ? AND counter = ? AND sha256 != ?",
                               (node, policy_version, counter, sha256)).fetchone()
            if other:
                return Grant.COUNTER_USED
            db.execute("DELETE FROM slots WHERE sha256 = ? AND node = ? AND used = ?",
                       (sha256, node, SlotUse.FREE))
            db.execute("INSERT INTO slots VALUES (?, ?, ?, ?, ?, ?)",
                       (slot_id, node, sha256, size, expires_at, SlotUse.FREE))
            values = (node, provider, policy_version, work_units, size, counter,
                      FileStatus.GRANTED.value, time.time())
            if old is None:
                db.execute("INSERT INTO files (node, provider, policy_version, work_units, "
                           "size, counter, status, updated_at, sha256) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*values, sha256))
            else:  # granted afresh: an expired grant, or this node's unstored file again
                db.execute("UPDATE files SET node = ?, provider = ?, "
                           "policy_version = ?, work_units = ?, size = ?, counter = ?, "
                           "status = ?, updated_at = ?, verdict = '', verdict_reason = '', "
                           "validator = '', "
                           "work_id = '', uploaded = 0 WHERE seq = ?", (*values, old[0]))
        return Grant.GRANTED

    def reset_uploads(self) -> int:
        """At start: no upload survives the process that received it, so a slot left
        `uploading` by a kill is free again (the store removed its partial bytes)."""
        cur = self.db.execute("UPDATE slots SET used = ? WHERE used = ?",
                              (SlotUse.FREE, SlotUse.UPLOADING))
        return cur.rowcount

    def add_claim(self, sha256: str, node: str, provider: str, work_units: int,
                  work_id: str) -> FileRow:
        """The row of a submission on chain of a file this pool did not grant `node`: judged
        like any other, never trained on. Version and size are the granted file's when the
        pool knows the file (same bytes), else -1 and 0."""
        known = self.file(sha256)
        version, size = (known.policy_version, known.size) if known else (-1, 0)
        self.db.execute(
            "INSERT INTO files (sha256, node, provider, policy_version, work_units, size, "
            "status, updated_at, work_id, granted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (sha256, node, provider, version, work_units, size,
             FileStatus.SUBMITTED.value, time.time(), work_id))
        self.files_alarm.ring()  # (in a transaction its commit rings too)
        row = self.file_by_work_id(work_id)
        assert row is not None
        return row

    def claim_slot(self, slot_id: str) -> bool:
        """Take a free slot for one upload (so two concurrent uploads cannot both use it)."""
        cur = self.db.execute("UPDATE slots SET used = ? WHERE slot_id = ? AND used = ?",
                              (SlotUse.UPLOADING, slot_id, SlotUse.FREE))
        return cur.rowcount == 1

    def release_slot(self, slot_id: str) -> None:
        """A failed upload gives its slot back (nothing was stored)."""
        self.db.execute("UPDATE slots SET used = ? WHERE slot_id = ? AND used = ?",
                        (SlotUse.FREE, slot_id, SlotUse.UPLOADING))

    def finish_upload(self, slot_id: str, sha256: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE slots SET used = ? WHERE slot_id = ?", (SlotUse.DONE, slot_id))
            db.execute("UPDATE files SET status = ?, uploaded = 1, updated_at = ? "
                       "WHERE sha256 = ? AND granted = 1",
                       (FileStatus.UPLOADED.value, time.time(), sha256))

    def expire_slots(self, now: float) -> int:
        """Slots never used past their expiry: their files become `expired` (can be re-granted)."""
        with self.tx() as db:
            rows = db.execute("SELECT slot_id, sha256 FROM slots WHERE used = ? AND "
                              "expires_at < ?", (SlotUse.FREE, now)).fetchall()
            for slot_id, sha256 in rows:
                db.execute("DELETE FROM slots WHERE slot_id = ?", (slot_id,))
                db.execute("UPDATE files SET status = ?, updated_at = ? WHERE sha256 = ? AND "
                           "granted = 1 AND status = ?", (FileStatus.EXPIRED.value, now, sha256,
                                                          FileStatus.GRANTED.value))
        return len(rows)

    # batches (issue 46)
    def batch(self, batch_id: str) -> BatchRow | None:
        r = self.db.execute("SELECT batch_id, node, root, leaves, count, units, submitted FROM "
                            "batches WHERE batch_id = ?", (batch_id,)).fetchone()
        return None if r is None else BatchRow(*r[:6], bool(r[6]))

    def post_batch(self, batch_id: str, node: str, root: str, leaves: str,
                   seqs: list[int]) -> None:
        """A node's batch: its leaves, and each leaf's file row names the batch (a file is in
        one batch of its node). A batch the chain announced already keeps its count/units."""
        with self.tx() as db:
            db.execute("INSERT INTO batches (batch_id, node, root, leaves, posted_at) VALUES "
                       "(?, ?, ?, ?, ?) ON CONFLICT(batch_id) DO UPDATE SET leaves = "
                       "excluded.leaves, posted_at = excluded.posted_at",
                       (batch_id, node, root, leaves, time.time()))
            for seq in seqs:
                db.execute("UPDATE files SET batch_id = ? WHERE seq = ?", (batch_id, seq))

    def batch_seen(self, batch_id: str, node: str, root: str, count: int, units: int) -> None:
        """The chain's BatchSubmitted: the batch is submitted with this count and units."""
        self.db.execute("INSERT INTO batches (batch_id, node, root, count, units, submitted) "
                        "VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT(batch_id) DO UPDATE SET count = "
                        "excluded.count, units = excluded.units, submitted = 1",
                        (batch_id, node, root, count, units))

    def set_work_id(self, seq: int, work_id: str) -> None:
        self.db.execute("UPDATE files SET work_id = ? WHERE seq = ?", (work_id, seq))
        self.files_alarm.ring()  # a ledger read by work id may wait for it

    def backlog(self, taken_through: int, min_version: int, uploaded_after: float,
                node: str | None = None) -> int:
        """Granted files of policy versions >= `min_version` that the trainer has not taken:
        granted (slot unexpired) by a live node, or uploaded by one after `uploaded_after` (a
        dead node's never reach the chain until it is back; an upload not submitted by its
        deadline is no longer in flight), submitted (every submission is judged), or accepted
        after acceptance number `taken_through` (the pacing's count, docs/services.md); of
        `node` alone when it is given."""
        live = (NodeState.HEALTHY.value, NodeState.UNHEALTHY.value)
        row = self.db.execute(
            "SELECT COUNT(*) FROM files WHERE granted = 1 AND policy_version >= ? AND "
            "(((status = ? OR (status = ? AND updated_at > ?)) "
            "AND node IN (SELECT address FROM nodes WHERE state IN (?, ?))) "
            "OR status = ? OR (status = ? AND accepted_seq > ?))"
            + ("" if node is None else " AND node = ?"),
            (min_version, FileStatus.GRANTED.value, FileStatus.UPLOADED.value, uploaded_after,
             *live, FileStatus.SUBMITTED.value, FileStatus.ACCEPTED.value, taken_through,
             *(() if node is None else (node,)))).fetchone()
        return int(row[0])

    def overdue_uploads(self, node: str, uploaded_before: float, since: float) -> int:
        """`node`'s files uploaded before `uploaded_before` (their submission deadline passed)
        and after `since`, still not submitted on chain: uploads it owes the chain. A late
        submission moves a row to `submitted`, so it stops counting at once."""
        row = self.db.execute(
            "SELECT COUNT(*) FROM files WHERE granted = 1 AND node = ? AND status = ? AND "
            "updated_at <= ? AND updated_at > ?",
            (node, FileStatus.UPLOADED.value, uploaded_before, since)).fetchone()
        return int(row[0])

    def able_nodes(self, among: list[str], versions: list[int], files_per_step: int) -> int:
        """The nodes of `among` (addresses) that can make a file now: healthy, their last
        heartbeat names a version in `versions`, and they have counters of it left."""
        if not among:
            return 0
        marks = ",".join("?" * len(among))
        row = self.db.execute(
            f"SELECT COUNT(*) FROM nodes n WHERE n.address IN ({marks}) AND n.state = ? AND "
            "n.policy_version BETWEEN ? AND ? AND (SELECT COUNT(*) FROM files f WHERE "
            "f.granted = 1 AND f.node = n.address AND f.policy_version = n.policy_version AND "
            "f.counter >= 0) < ?",
            (*among, NodeState.HEALTHY.value, min(versions), max(versions),
             files_per_step)).fetchone()
        return int(row[0])

    def granted_count(self, node: str, version: int) -> int:
        """Counters `node` has used at policy version `version` (its granted files of it)."""
        row = self.db.execute("SELECT COUNT(*) FROM files WHERE granted = 1 AND node = ? AND "
                              "policy_version = ? AND counter >= 0", (node, version)).fetchone()
        return int(row[0])

    def count_files(self) -> dict[FileStatus, int]:
        rows = self.db.execute("SELECT status, COUNT(*) FROM files GROUP BY status")
        return {FileStatus(status): n for status, n in rows}


class PoolStep:
    """The pool's step (kept in the state's meta table, so a restart resumes it) and the policy
    versions a node may generate with at that step."""

    def __init__(self, state: State, initial: int, async_level: int) -> None:
        self._state, self.async_level = state, async_level
        self.step = int(state.get_meta(POOL_STEP, str(initial)))

    def set(self, step: int) -> None:
        self._state.set_meta(POOL_STEP, str(step))
        self.step = step

    def versions(self) -> list[int]:
        return list(range(max(0, self.step - self.async_level), self.step + 1))
