"""Discovery's registry in SQLite (WAL): one row per announced node."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from meshrl.wire.models import NodeAnnouncement, NodeEntry, NodeStatus

__all__ = ["Registry"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, pool_id INTEGER NOT NULL,
    info TEXT NOT NULL, status TEXT NOT NULL, chain_pool INTEGER NOT NULL DEFAULT 0,
    ip TEXT NOT NULL, updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS nodes_pool ON nodes (pool_id);
CREATE INDEX IF NOT EXISTS nodes_ip ON nodes (ip);
"""


def _entry(row: tuple) -> NodeEntry:
    address, _, _, info, status, chain_pool, ip, updated = row
    return NodeEntry(address=address, info=NodeAnnouncement.model_validate_json(info),
                     status=NodeStatus(status), chain_pool=chain_pool, ip=ip, updated_at=updated)


class Registry:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def get(self, address: str) -> NodeEntry | None:
        row = self.db.execute("SELECT * FROM nodes WHERE address = ?", (address,)).fetchone()
        return None if row is None else _entry(row)

    def count_ip(self, ip: str, besides: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM nodes WHERE ip = ? AND address != ?",
                               (ip, besides)).fetchone()[0]

    def put(self, e: NodeEntry) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (e.address, e.info.provider, e.info.pool_id, e.info.model_dump_json(),
             e.status.value, e.chain_pool, e.ip, e.updated_at))

    def set_status(self, address: str, status: NodeStatus, chain_pool: int) -> None:
        self.db.execute("UPDATE nodes SET status = ?, chain_pool = ? WHERE address = ?",
                        (status.value, chain_pool, address))

    def delete(self, address: str) -> None:
        self.db.execute("DELETE FROM nodes WHERE address = ?", (address,))

    def for_pool(self, pool_id: int) -> list[NodeEntry]:
        rows = self.db.execute("SELECT * FROM nodes WHERE pool_id = ? ORDER BY address",
                               (pool_id,))
        return [_entry(r) for r in rows]

    def all(self) -> list[NodeEntry]:
        return [_entry(r) for r in self.db.execute("SELECT * FROM nodes ORDER BY address")]
