"""Discovery's registry in SQLite (WAL): one row per announced node."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from meshrl.log import get_logger, log_event
from meshrl.wire.models import NodeAnnouncement, NodeEntry, NodeStatus

__all__ = ["Registry"]

log = get_logger("meshrl.discovery")

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, pool_id INTEGER NOT NULL,
    info TEXT NOT NULL, status TEXT NOT NULL, chain_pool INTEGER NOT NULL DEFAULT 0,
    ip TEXT NOT NULL, updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS nodes_pool ON nodes (pool_id);
CREATE INDEX IF NOT EXISTS nodes_ip ON nodes (ip);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _entry(row: tuple) -> NodeEntry:
    address, _, _, info, status, chain_pool, ip, updated = row
    return NodeEntry(address=address, info=NodeAnnouncement.model_validate_json(info),
                     status=NodeStatus(status), chain_pool=chain_pool, ip=ip, updated_at=updated)


def _entries(rows: Iterable[tuple]) -> list[NodeEntry]:
    """The readable entries of `rows`: one that is not (a registry written before its values
    were bounded) is left out rather than failing every listing and sync."""
    out = []
    for row in rows:
        try:
            out.append(_entry(row))
        except ValueError as e:  # pydantic's ValidationError included
            log_event(log, "unreadable registry entry skipped", node=row[0], error=str(e)[:200])
    return out


class Registry:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def instance_id(self) -> str:
        """This registry's random id, made once with its database (16 hex digits): the one
        audience its seen nonces are kept for, so no other registry shares it."""
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('instance', ?)",
                        (secrets.token_hex(8),))
        return str(self.db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0])

    def get(self, address: str) -> NodeEntry | None:
        row = self.db.execute("SELECT * FROM nodes WHERE address = ?", (address,)).fetchone()
        found = _entries([row] if row is not None else [])
        return found[0] if found else None

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]

    def count_ip(self, ip: str, besides: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM nodes WHERE ip = ? AND address != ?",
                               (ip, besides)).fetchone()[0]

    def put(self, e: NodeEntry) -> None:
        """Store `e`; what is stored must read back (the wire's bounds make it so: checked)."""
        info = e.info.model_dump_json()
        NodeAnnouncement.model_validate_json(info)
        self.db.execute(
            "INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (e.address, e.info.provider, e.info.pool_id, info,
             e.status.value, e.chain_pool, e.ip, e.updated_at))

    def set_status(self, address: str, status: NodeStatus, chain_pool: int) -> None:
        self.db.execute("UPDATE nodes SET status = ?, chain_pool = ? WHERE address = ?",
                        (status.value, chain_pool, address))

    def delete(self, address: str) -> None:
        self.db.execute("DELETE FROM nodes WHERE address = ?", (address,))

    def for_pool(self, pool_id: int) -> list[NodeEntry]:
        rows = self.db.execute("SELECT * FROM nodes WHERE pool_id = ? ORDER BY address",
                               (pool_id,))
        return _entries(rows)

    def all(self) -> list[NodeEntry]:
        return _entries(self.db.execute("SELECT * FROM nodes ORDER BY address"))
