"""The pool's money as the chain has it, per node: stake of its provider, slashes, and rewards
earned / claimed / claimable, kept from the contract events the follower applies.

The rules mirror `work.vy` (and `meshrl.protocol.history`, the report's source):
- a reward is earned while its item is valid: submitted and not wiped, or claimed; an accused
  item is not, until its verdict is overturned (`VerdictOverturned`);
- hard verdicts are numbered per (provider, node) (`WorkAccused.index`, in any pool), and an item
  notes how many came before it; an upheld one (`RewardsWiped`, which may come from another
  pool) wipes the provider's items of that node made before it whose invalidation windows
  (fixed at submission) were still open at it; at each item the first verdict after it that
  was not overturned decides: upheld, wiped; open, the item waits. The follower reads every
  event from deployment, so its numbering is the chain's;
- a batch (issue 46) is one item under its batch id (`BatchSubmitted`); a leaf a validator
  opens (`LeafOpened`) takes its reward out of the batch's item into an item of its own under
  the file's work id, with the batch's times and standing (a copy's reward is void), so
  nothing is counted twice; every later event names the leaf's work id;
- claimable now: submitted, not wiped, under no open verdict, unlocked at the latest block seen,
  and its provider under no open hard verdict (any node, any pool) nor under review
  (`ReviewOpened`: an upheld hard verdict puts a provider's unclaimed work under review).

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
CREATE TABLE IF NOT EXISTS verdicts (
    provider TEXT NOT NULL, node TEXT NOT NULL, idx INTEGER NOT NULL, at INTEGER NOT NULL,
    work_id TEXT NOT NULL, state TEXT NOT NULL, PRIMARY KEY (provider, node, idx)
);
CREATE INDEX IF NOT EXISTS verdicts_work ON verdicts (work_id);
CREATE TABLE IF NOT EXISTS reviews (provider TEXT PRIMARY KEY, until INTEGER NOT NULL);
"""
# columns added to `works` after its first schema (a database from before gains them)
WORK_COLUMNS = (("judge_until", "INTEGER NOT NULL DEFAULT 0"),
                ("verdicts_before", "INTEGER NOT NULL DEFAULT 0"))

STAKE_EVENTS = ("ProviderRegistered", "StakeAdded", "UnstakeRequested", "Withdrawn", "Slashed")
TIMED = ("WorkSubmitted", "BatchSubmitted", "WorkInvalidated", "RewardsClaimed",
         "WorkAccused")  # block times
LOCK = "lock_period"
WINDOW = "invalidation_window"
CHAIN_TIME = "chain_time"
SUBMITTED, CLAIMED, ACCUSED = "submitted", "claimed", "accused"
OPEN, UPHELD, OVERTURNED = "open", "upheld", "overturned"
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
        have = {r[1] for r in db.execute("PRAGMA table_info(works)")}
        for name, decl in WORK_COLUMNS:
            if name not in have:
                db.execute(f"ALTER TABLE works ADD COLUMN {name} {decl}")

    # meta (the orchestrator's meta table)
    def _meta(self, key: str) -> int | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                        "SET value = excluded.value", (key, str(value)))

    def has_lock_period(self) -> bool:
        return self._meta(LOCK) is not None and self._meta(WINDOW) is not None

    def set_lock_period(self, seconds: int, window: int | None = None) -> None:
        """The lock period and invalidation window new items are submitted under."""
        self._set_meta(LOCK, seconds)
        if window is not None:
            self._set_meta(WINDOW, window)

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
        elif ev.name == "BatchSubmitted" and a["pool"] == self.pool_id:
            self._submitted({**a, "work_id": a["batch_id"]}, int(ts or 0), provider_of)
        elif ev.name == "LeafOpened":
            self._opened(a)
        elif ev.name == "WorkAccused":
            self._accused(a, int(ts or 0))
        elif ev.name == "WorkInvalidated":
            self._invalidated(a)
        elif ev.name == "RewardsWiped":
            self.db.execute("UPDATE verdicts SET state = ? WHERE provider = ? AND node = ? AND "
                            "idx = ?", (UPHELD, a["provider"].lower(), a["node"].lower(),
                                        a["index"]))
        elif ev.name == "VerdictOverturned":
            self._overturned(bytes(a["work_id"]).hex())
        elif ev.name == "ReviewOpened":
            self.db.execute("INSERT INTO reviews VALUES (?, ?) ON CONFLICT(provider) DO UPDATE "
                            "SET until = max(until, excluded.until)",
                            (a["provider"].lower(), int(a["until"])))
        elif ev.name == "RewardsClaimed":
            self._claimed(a["provider"].lower(), ev.tx_hash, int(ts or 0))
        elif ev.name == "WorkParamsSet":
            self.set_lock_period(a["lock_period"], a["invalidation_window"])
        elif ev.name in STAKE_EVENTS:
            p = a["provider"].lower()
            if self.db.execute("SELECT 1 FROM providers WHERE address = ?", (p,)).fetchone():
                self._want_stake(p)

    def _submitted(self, a: dict[str, Any], ts: int, provider_of: dict[str, str]) -> None:
        wid, node = bytes(a["work_id"]).hex(), a["node"].lower()
        provider = provider_of.get(node, "").lower()
        lock, window = self._meta(LOCK) or 0, self._meta(WINDOW) or 0
        before = self.db.execute("SELECT count(*) FROM verdicts WHERE provider = ? AND node = ?",
                                 (provider, node)).fetchone()[0]
        cur = self.db.execute(
            "INSERT OR IGNORE INTO works (work_id, node, provider, reward, unlock_at, generation,"
            " status, wiped, judge_until, verdicts_before) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
            (wid, node, provider, str(a["reward"]), ts + lock, self._generation(node), SUBMITTED,
             ts + window, before))
        if cur.rowcount:
            self._add(node, "earned", a["reward"])

    def _opened(self, a: dict[str, Any]) -> None:
        """A leaf taken out of a batch of this pool: its reward leaves the batch's item and
        becomes an item of its own with the batch's node, times and standing; a copy's (the
        file had an item already) is void, so it is earned no more."""
        bid, wid = bytes(a["batch_id"]).hex(), bytes(a["work_id"]).hex()
        row = self.db.execute("SELECT node, provider, reward, unlock_at, generation, status, "
                              "judge_until, verdicts_before FROM works WHERE work_id = ?",
                              (bid,)).fetchone()
        if row is None:
            return  # another pool's batch
        reward = int(a["reward"])
        self.db.execute("UPDATE works SET reward = ? WHERE work_id = ?",
                        (str(int(row[2]) - reward), bid))
        if a["copy"]:
            if row[5] == SUBMITTED:
                self._add(row[0], "earned", -reward)
            return
        self.db.execute(
            "INSERT OR IGNORE INTO works (work_id, node, provider, reward, unlock_at, generation,"
            " status, wiped, judge_until, verdicts_before) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
            (wid, row[0], row[1], str(reward), row[3], row[4], SUBMITTED, row[6], row[7]))

    def _accused(self, a: dict[str, Any], ts: int) -> None:
        wid = bytes(a["work_id"]).hex()
        if a["hard"]:  # numbered per (provider, node), whatever the pool
            self.db.execute("INSERT OR IGNORE INTO verdicts VALUES (?, ?, ?, ?, ?, ?)",
                            (a["provider"].lower(), a["node"].lower(), a["index"] - 1, ts, wid,
                             OPEN))
        row = self.db.execute("SELECT node, reward FROM works WHERE work_id = ? AND status = ?",
                              (wid, SUBMITTED)).fetchone()
        if row is not None:  # this pool's item: its reward waits for the verdict
            self.db.execute("UPDATE works SET status = ? WHERE work_id = ?", (ACCUSED, wid))
            self._add(row[0], "earned", -int(row[1]))

    def _overturned(self, wid: str) -> None:
        self.db.execute("UPDATE verdicts SET state = ? WHERE work_id = ?", (OVERTURNED, wid))
        row = self.db.execute("SELECT node, reward FROM works WHERE work_id = ? AND status = ?",
                              (wid, ACCUSED)).fetchone()
        if row is not None:
            self.db.execute("UPDATE works SET status = ? WHERE work_id = ?", (SUBMITTED, wid))
            self._add(row[0], "earned", int(row[1]))

    def _invalidated(self, a: dict[str, Any]) -> None:
        wid = bytes(a["work_id"]).hex()
        row = self.db.execute("SELECT node, reward, status FROM works WHERE work_id = ?",
                              (wid,)).fetchone()
        if row is None or row[2] not in (SUBMITTED, ACCUSED):
            return  # not this pool's work, or applied before
        node, reward = row[0], int(row[1])
        status = "hard_invalidated" if a["hard"] else "soft_invalidated"
        self.db.execute("UPDATE works SET status = ? WHERE work_id = ?", (status, wid))
        if row[2] == SUBMITTED:
            self._add(node, "earned", -reward)
        if a["hard"]:
            self._add(node, "slashed", a["slashed"])

    def _standing(self, provider: str, node: str, before: int, judge_until: int) -> str:
        """What the verdicts on (provider, node) say of an item (as `work.vy`'s `_standing`):
        'clear', 'wiped' or 'disputed'."""
        for at, state in self.db.execute(
                "SELECT at, state FROM verdicts WHERE provider = ? AND node = ? AND idx >= ? "
                "ORDER BY idx", (provider, node, before)):
            if int(at) >= judge_until:
                break
            if state == UPHELD:
                return "wiped"
            if state == OPEN:
                return "disputed"
        return "clear"

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
        wiped: dict[str, int] = {}
        judged = {(p, n) for p, n in self.db.execute("SELECT DISTINCT provider, node FROM "
                                                      "verdicts")}
        # providers whose claims wait: under an open hard verdict, or under review
        held = {p for (p,) in self.db.execute("SELECT DISTINCT provider FROM verdicts WHERE "
                                              "state = ?", (OPEN,))}
        held |= {p for (p,) in self.db.execute("SELECT provider FROM reviews WHERE until > ?",
                                               (now,))}
        for node, provider, reward, unlock_at, judge_until, before in self.db.execute(
                "SELECT node, provider, reward, unlock_at, judge_until, verdicts_before FROM "
                "works WHERE status = ?", (SUBMITTED,)).fetchall():
            standing = ("clear" if (provider, node) not in judged
                        else self._standing(provider, node, int(before), int(judge_until)))
            if standing == "wiped":
                wiped[node] = wiped.get(node, 0) + int(reward)
            elif standing == "clear" and int(unlock_at) <= now and provider not in held:
                claimable[node] = claimable.get(node, 0) + int(reward)
        stakes = dict(self.db.execute("SELECT address, stake FROM providers").fetchall())
        out = {}
        for node, earned, claimed, slashed in self.db.execute(
                "SELECT node, earned, claimed, slashed FROM accounts"):
            out[node] = NodeMoney(0, int(slashed), int(earned) - wiped.get(node, 0),
                                  int(claimed), claimable.get(node, 0))
        for node, provider in self.db.execute("SELECT lower(address), lower(provider) "
                                              "FROM nodes"):
            m = out.get(node)
            if m is not None:
                out[node] = NodeMoney(int(stakes.get(provider, 0)), m.slashed, m.earned,
                                      m.claimed, m.claimable)
        return out
