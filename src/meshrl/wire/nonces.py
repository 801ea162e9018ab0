"""Request nonces a server has seen, each kept until its timestamp window closes.

`NonceStore` keeps them in memory. `SqliteNonceStore` also writes each one into a table of the
service's own SQLite database before the request is served, and reads the live ones back when
it opens, so a restarted server (even after `kill -9`) still refuses a request it served in the
window before. The memory copy still answers `seen` (no query on the hot path); the table costs
one autocommitted INSERT per accepted request, plus a range DELETE of expired rows at most every
`prune_every_s`.
"""

from __future__ import annotations

import heapq
import sqlite3
import time

from meshrl.wire.errors import ErrorCode, WireError

__all__ = ["NonceStore", "SqliteNonceStore"]

# Keyed by expiry first: an insert lands at the B-tree's end (expiries only grow, give or take
# the clock skew) and pruning deletes a prefix. The same (address, nonce) twice is harmless.
SCHEMA = """
CREATE TABLE IF NOT EXISTS request_nonces (
    expiry REAL NOT NULL, address TEXT NOT NULL, nonce TEXT NOT NULL,
    PRIMARY KEY (expiry, address, nonce)
) WITHOUT ROWID
"""


class NonceStore:
    """Nonces seen per address, each kept until `expiry`; O(log n) insert, amortized expiry."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, str, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, address: str, nonce: str, now: float) -> bool:
        self._expire(now)
        return (address, nonce) in self._seen

    def add(self, address: str, nonce: str, expiry: float) -> None:
        self._seen[(address, nonce)] = expiry
        heapq.heappush(self._heap, (expiry, address, nonce))

    def _expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            _, address, nonce = heapq.heappop(self._heap)
            self._seen.pop((address, nonce), None)


class SqliteNonceStore(NonceStore):
    """A `NonceStore` that survives a restart: every nonce is committed to `db` (a connection in
    autocommit mode, e.g. the service's state) before `add` returns."""

    def __init__(self, db: sqlite3.Connection, now: float | None = None,
                 prune_every_s: float = 30.0) -> None:
        if db.isolation_level is not None:
            raise ValueError("the nonce store needs an autocommit connection "
                             "(isolation_level=None): a nonce must be committed when added")
        super().__init__()
        self.db, self.prune_every_s = db, prune_every_s
        db.execute(SCHEMA)
        self._pruned_at = time.time() if now is None else now
        db.execute("DELETE FROM request_nonces WHERE expiry < ?", (self._pruned_at,))
        rows = db.execute("SELECT expiry, address, nonce FROM request_nonces ORDER BY expiry")
        for expiry, address, nonce in rows:
            super().add(address, nonce, expiry)  # memory only: the row is there

    def add(self, address: str, nonce: str, expiry: float) -> None:
        self._execute("INSERT OR IGNORE INTO request_nonces VALUES (?, ?, ?)",
                      (expiry, address, nonce))
        super().add(address, nonce, expiry)

    def _expire(self, now: float) -> None:
        super()._expire(now)
        if now - self._pruned_at >= self.prune_every_s:
            self._execute("DELETE FROM request_nonces WHERE expiry < ?", (now,))
            self._pruned_at = now

    def _execute(self, sql: str, args: tuple[object, ...]) -> None:
        try:
            self.db.execute(sql, args)
        except sqlite3.Error as e:  # an unrecorded nonce could be replayed: serve nothing
            raise WireError(ErrorCode.NONCE_STORE_UNAVAILABLE, str(e)) from None
