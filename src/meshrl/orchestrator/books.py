"""The pool's money as the chain has it, per node: stake of its provider, slashes, and rewards
earned / claimed / claimable, kept from the contract events the follower applies.

The rules mirror `work.vy` (and `meshrl.protocol.history`, the report's source):
- a reward is earned while its item is valid: submitted and not wiped, or claimed;
- a hard invalidation wipes every item of the node generation it was done in that is still
  locked at the generation's first judgment (unlock_at > wiped_at); wipes are final;
- a node generation ends when the node is ejected (from any pool), removed, or judged while the
  judged work's generation is still current. The follower reads every event from deployment,
  so a local generation counter per node partitions the items exactly as the chain's does;
- claimable now: submitted, not wiped, unlocked at the latest block seen.

Token amounts exceed SQLite's 64-bit integers, so they are stored as decimal text. Chain calls
are kept to block timestamps (batched), one stake read per touched provider per poll, and one
transaction read per claim that may have paid this pool's items.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from meshrl.protocol.events import Event

__all__ = ["CLAIMED_CODE", "SCHEMA", "STAKE_EVENTS", "Books", "NodeMoney"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS works (
    work_id TEXT PRIMARY KEY, node TEXT NOT NULL, provider TEXT NOT NULL, reward TEXT NOT NULL,
    unlock_at INTEGER NOT NULL, generation INTEGER NOT NULL, status TEXT NOT NULL,
    wiped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS works_gen ON works (node, generation, status);
CREATE INDEX IF NOT EXISTS works_open ON works (status, wiped, unlock_at);
CREATE INDEX IF NOT EXISTS works_provider ON works (provider, status);
CREATE TABLE IF NOT EXISTS accounts (
    node TEXT PRIMARY KEY, generation INTEGER NOT NULL DEFAULT 0,
    earned TEXT NOT NULL DEFAULT '0', claimed TEXT NOT NULL DEFAULT '0',
    slashed TEXT NOT NULL DEFAULT '0'
);
CREATE TABLE IF NOT EXISTS providers (address TEXT PRIMARY KEY, stake TEXT NOT NULL DEFAULT '0');
CREATE TABLE IF NOT EXISTS wipes (
    node TEXT NOT NULL, generation INTEGER NOT NULL, wiped_at INTEGER NOT NULL,
    PRIMARY KEY (node, generation)
);
CREATE TABLE IF NOT EXISTS pending (kind TEXT NOT NULL, key TEXT NOT NULL, at INTEGER NOT NULL,
                                    PRIMARY KEY (kind, key, at));
"""

STAKE_EVENTS = ("ProviderRegistered", "StakeAdded", "UnstakeRequested", "Withdrawn", "Slashed")
TIMED = ("WorkSubmitted", "WorkInvalidated", "RewardsClaimed")  # need their block's timestamp
LOCK = "lock_period"
CHAIN_TIME = "chain_time"
SUBMITTED, CLAIMED = "submitted", "claimed"
CLAIMED_CODE = 4  # WorkStatus.CLAIMED on chain


@dataclass(frozen=True)
class NodeMoney:
    stake: int  # its provider's current stake
    slashed: int  # slashed from its provider for this node's hard-invalidated work
    earned: int
    claimed: int
    claimable: int


class Books:
    """Applies money events inside the follower's transaction (no chain calls there); the
    calls it needs afterwards are listed by `pending_*` and answered by `resolve`."""

    def __init__(self, db: sqlite3.Connection, pool_id: int) -> None:
        self.db, self.pool_id = db, pool_id
        db.executescript(SCHEMA)

    # meta (the orchestrator's meta table)
    def _meta(self, key: str) -> int | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                        "SET value = excluded.value", (key, str(value)))

    def has_lock_period(self) -> bool:
        return self._meta(LOCK) is not None

    def set_lock_period(self, seconds: int) -> None:
        self._set_meta(LOCK, seconds)

    def set_chain_time(self, ts: int) -> None:
        self._set_meta(CHAIN_TIME, ts)

    def needs_time(self, ev: Event) -> bool:
        return ev.name in TIMED

    # small helpers
    def _add(self, node: str, column: str, amount: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO accounts (node) VALUES (?)", (node,))
        row = self.db.execute(f"SELECT {column} FROM accounts WHERE node = ?", (node,)).fetchone()
        self.db.execute(f"UPDATE accounts SET {column} = ? WHERE node = ?",
                        (str(int(row[0]) + amount), node))

    def _generation(self, node: str) -> int:
        row = self.db.execute("SELECT generation FROM accounts WHERE node = ?",
                              (node,)).fetchone()
        return 0 if row is None else int(row[0])

    def _next_generation(self, node: str) -> None:
        self.db.execute("UPDATE accounts SET generation = generation + 1 WHERE node = ?", (node,))

    def _want_stake(self, provider: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO pending VALUES ('stake', ?, 0)", (provider,))

    # events
    def joined(self, node: str, provider: str) -> None:
        """A node joined this pool: it gets an account and its provider's stake is read."""
        provider = provider.lower()
        self.db.execute("INSERT OR IGNORE INTO accounts (node) VALUES (?)", (node.lower(),))
        self.db.execute("INSERT OR IGNORE INTO providers (address) VALUES (?)", (provider,))
        self._want_stake(provider)

    def apply(self, ev: Event, ts: int | None, provider_of: dict[str, str]) -> None:
        """One event; `ts` is its block's timestamp for `TIMED` events, `provider_of` maps a
        (lower-case) node of this pool to its provider."""
        a = ev.args
        if ev.name in ("NodeEjected", "NodeRemoved"):
            self._next_generation(a["node"].lower())
        elif ev.name == "WorkSubmitted" and a["pool"] == self.pool_id:
            self._submitted(a, int(ts or 0), provider_of)
        elif ev.name == "WorkInvalidated":
            self._invalidated(a, int(ts or 0))
        elif ev.name == "RewardsClaimed":
            self._claimed(a["provider"].lower(), ev.tx_hash, int(ts or 0))
        elif ev.name == "WorkParamsSet":
            self.set_lock_period(a["lock_period"])
        elif ev.name in STAKE_EVENTS:
            p = a["provider"].lower()
            if self.db.execute("SELECT 1 FROM providers WHERE address = ?", (p,)).fetchone():
                self._want_stake(p)

    def _submitted(self, a: dict[str, Any], ts: int, provider_of: dict[str, str]) -> None:
        wid, node = bytes(a["work_id"]).hex(), a["node"].lower()
        lock = self._meta(LOCK) or 0
        cur = self.db.execute(
            "INSERT OR IGNORE INTO works VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
            (wid, node, provider_of.get(node, "").lower(), str(a["reward"]), ts + lock,
             self._generation(node), SUBMITTED))
        if cur.rowcount:
            self._add(node, "earned", a["reward"])

    def _invalidated(self, a: dict[str, Any], ts: int) -> None:
        wid = bytes(a["work_id"]).hex()
        row = self.db.execute("SELECT node, reward, generation, status FROM works "
                              "WHERE work_id = ?", (wid,)).fetchone()
        if row is None or row[3] != SUBMITTED:
            return  # not this pool's work, or applied before
        node, reward, gen = row[0], int(row[1]), int(row[2])
        status = "hard_invalidated" if a["hard"] else "soft_invalidated"
        self.db.execute("UPDATE works SET status = ? WHERE work_id = ?", (status, wid))
        self._add(node, "earned", -reward)
        if not a["hard"]:
            return
        self._add(node, "slashed", a["slashed"])
        first = self.db.execute("INSERT OR IGNORE INTO wipes VALUES (?, ?, ?)", (node, gen, ts))
        if first.rowcount:  # the first judgment of a generation fixes its wipe time
            wiped = self.db.execute(
                "SELECT work_id, reward FROM works WHERE node = ? AND generation = ? AND "
                "status = ? AND wiped = 0 AND unlock_at > ?",
                (node, gen, SUBMITTED, ts)).fetchall()
            for w, r in wiped:
                self.db.execute("UPDATE works SET wiped = 1 WHERE work_id = ?", (w,))
                self._add(node, "earned", -int(r))
        if gen == self._generation(node):  # not ejected (that event came first): ends here
            self._next_generation(node)

    def _candidates(self, provider: str, ts: int) -> list[tuple[str, str, int]]:
        rows = self.db.execute("SELECT work_id, node, reward FROM works WHERE provider = ? AND "
                               "status = ? AND wiped = 0 AND unlock_at <= ?",
                               (provider, SUBMITTED, ts)).fetchall()
        return [(w, n, int(r)) for w, n, r in rows]

    def _claimed(self, provider: str, tx_hash: str, ts: int) -> None:
        """A claim names only its provider, amount and count: which items it paid is read
        after the batch (the claim's transaction, one call) if any of this pool could be."""
        known = self.db.execute("SELECT 1 FROM providers WHERE address = ?",
                                (provider,)).fetchone()
        if known and self._candidates(provider, ts):
            self.db.execute("INSERT OR IGNORE INTO pending VALUES ('claim', ?, ?)",
                            (f"{provider} {tx_hash}", ts))

    def mark_claimed(self, work_ids: list[str]) -> None:
        for wid in work_ids:
            row = self.db.execute("SELECT node, reward FROM works WHERE work_id = ? AND "
                                  "status = ?", (wid, SUBMITTED)).fetchone()
            if row is not None:
                self.db.execute("UPDATE works SET status = ? WHERE work_id = ?", (CLAIMED, wid))
                self._add(row[0], "claimed", int(row[1]))

    # what needs the chain after a batch
    def pending_stakes(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT key FROM pending WHERE kind = 'stake'")]

    def pending_claims(self) -> list[tuple[str, str, list[str]]]:
        """(key, transaction hash, candidate work ids) of each claim still to resolve."""
        out = []
        for key, ts in self.db.execute("SELECT key, at FROM pending WHERE kind = 'claim'"
                                       ).fetchall():
            provider, tx = key.split()
            out.append((key, tx, [w for w, *_ in self._candidates(provider, ts)]))
        return out

    def resolve(self, stakes: dict[str, int], claims: dict[str, list[str]]) -> None:
        """Write what the chain answered: stakes per provider, and per pending claim (key) the
        work ids it paid; both leave `pending`."""
        for provider, stake in stakes.items():
            self.db.execute("INSERT INTO providers VALUES (?, ?) ON CONFLICT(address) DO "
                            "UPDATE SET stake = excluded.stake", (provider, str(stake)))
            self.db.execute("DELETE FROM pending WHERE kind = 'stake' AND key = ?", (provider,))
        for key, paid in claims.items():
            self.mark_claimed(paid)
            self.db.execute("DELETE FROM pending WHERE kind = 'claim' AND key = ?", (key,))

    # the view
    def money(self) -> dict[str, NodeMoney]:
        """Per node (lower-case address) of this pool."""
        now = self._meta(CHAIN_TIME) or 0
        claimable: dict[str, int] = {}
        for node, reward in self.db.execute(
                "SELECT node, reward FROM works WHERE status = ? AND wiped = 0 AND "
                "unlock_at <= ?", (SUBMITTED, now)):
            claimable[node] = claimable.get(node, 0) + int(reward)
        stakes = dict(self.db.execute("SELECT address, stake FROM providers").fetchall())
        out = {}
        for node, earned, claimed, slashed in self.db.execute(
                "SELECT node, earned, claimed, slashed FROM accounts"):
            out[node] = NodeMoney(0, int(slashed), int(earned), int(claimed),
                                  claimable.get(node, 0))
        for node, provider in self.db.execute("SELECT lower(address), lower(provider) "
                                              "FROM nodes"):
            m = out.get(node)
            if m is not None:
                out[node] = NodeMoney(int(stakes.get(provider, 0)), m.slashed, m.earned,
                                      m.claimed, m.claimable)
        return out
