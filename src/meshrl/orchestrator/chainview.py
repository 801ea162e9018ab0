"""The orchestrator's view of the chain: checks on candidates and validators, ejection, invites,
and the event follower that moves the ledger and the node table.

web3 calls block, so they run on one worker thread (which also keeps this process's
transactions in nonce order); the event loop only awaits them.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.books import CLAIMED_CODE, Books
from meshrl.orchestrator.state import State
from meshrl.protocol.chain import Protocol
from meshrl.protocol.events import Event, EventCursor
from meshrl.protocol.signing import work_id
from meshrl.wire.models import FileStatus, NodeState

__all__ = ["ChainView", "Eligibility", "SignedInvite", "apply_batch"]

log = get_logger("meshrl.orchestrator.chain")
T = TypeVar("T")
ZERO = "0x" + "00" * 20
CURSOR = "chain_cursor"
BOOKS = "books_since"  # meta: the books were kept from this block (the deployment's)


class Eligibility:
    """Why a candidate may (reason "") or may not be invited."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def __bool__(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class SignedInvite:
    nonce: int
    expiry: int  # Unix seconds
    signature: str  # 0x-hex, the manager's EIP-191 signature
    domain: int


class ChainView:
    def __init__(self, protocol: Protocol, pool_id: int, validator_cache_s: float) -> None:
        self.protocol, self.pool_id = protocol, pool_id
        self.cache_s = validator_cache_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="chain")
        self._validators: dict[str, tuple[bool, float]] = {}
        self.cursor = protocol.events()
        self.books: Books | None = None
        self._last_time: tuple[int, int] = (-1, 0)  # (block, timestamp) of the last block read

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def is_validator(self, address: str) -> bool:
        hit = self._validators.get(address)
        if hit is not None and time.monotonic() - hit[1] < self.cache_s:
            return hit[0]
        ok = bool(await self.run(self.protocol.is_validator, address))
        self._validators[address] = (ok, time.monotonic())
        return ok

    def eligibility(self, node: str, provider: str) -> Eligibility:
        """Chain checks of a candidate: added by `provider`, provider staked, not in a pool,
        not blacklisted here, no open fraud verdict against the provider (blocking; call
        through `run`)."""
        p = self.protocol
        info = p.node(node)
        if info.provider == ZERO:
            return Eligibility("node not on chain")
        if info.provider.lower() != provider.lower():
            return Eligibility("node added by another provider")
        if info.pool != 0:
            return Eligibility(f"node already in pool {info.pool}")
        prov = p.provider(info.provider)
        if not prov.registered or prov.stake < p.required_stake(info.provider):
            return Eligibility("provider stake too low")
        if p.is_blacklisted(self.pool_id, node):
            return Eligibility("node blacklisted")
        # A hard verdict ejects its node at once but is final (and blacklists it) only after
        # its dispute period: invited again meanwhile, the node, or a fresh one of the same
        # provider, would go on cheating, be accused and ejected again, each round costing
        # transactions, files and re-judging.
        if p.open_verdicts(info.provider):
            return Eligibility("provider under an open fraud verdict")
        return Eligibility()

    def make_invite(self, node: str, ttl_s: int) -> SignedInvite:
        """A fresh invite of `node`, signed by the manager (blocking)."""
        nonce = secrets.randbits(63)
        # the latest block may be old on a quiet chain: count from whichever clock is later
        expiry = max(self.protocol.backend.now(), int(time.time())) + ttl_s
        sig = self.protocol.sign_invite(self.pool_id, node, nonce, expiry)
        domain = self.protocol.pool(self.pool_id).domain
        return SignedInvite(nonce, expiry, "0x" + sig.hex(), domain)

    async def eject(self, node: str) -> None:
        """Eject `node` on chain. Raises `NodeNotInPool` if it is out already (it left, or was
        ejected or blacklisted meanwhile), `ChainError` for any other failure."""
        await self.run(self.protocol.eject_node, self.pool_id, node)

    async def blacklist(self, node: str) -> None:
        """Blacklist `node` in this pool (ejecting it if still in); nothing to do if it already
        is. Raises `ChainError` when the chain refuses or cannot be reached."""
        if not await self.run(self.protocol.is_blacklisted, self.pool_id, node):
            await self.run(self.protocol.blacklist_node, self.pool_id, node)

    def restore_cursor(self, state: State) -> None:
        saved = state.get_meta(CURSOR)
        if saved:
            self.cursor.next_block = int(saved)

    async def open_books(self, state: State) -> None:
        """Start the money books (after `restore_cursor`). A database from before them is
        caught up once from the deployment block to the saved cursor, money events only."""
        books = self.books = Books(state.db, self.pool_id)
        if not books.has_lock_period():
            f = self.protocol.contract.functions
            lock = await self.run(self.protocol.backend.call, f.lock_period())
            window = await self.run(self.protocol.backend.call, f.invalidation_window())
            books.set_lock_period(int(lock), int(window))
        if state.get_meta(BOOKS):
            return
        upto = self.cursor.next_block
        start = self.protocol.events().next_block
        if upto > start:
            catchup = self.protocol.events(start)
            events, times, _ = await self.run(self._fetch, catchup, upto - 1)
            with state.tx():
                for n in state.nodes():
                    books.joined(n.address, n.provider)
                providers = self._providers(state)
                for ev in events:
                    books.apply(ev, times.get(ev.block), providers)
            log_event(log, "books caught up", events=len(events), upto=upto)
        state.set_meta(BOOKS, str(start))
        await self._resolve(state)

    def _fetch(self, cursor: EventCursor, upto: int | None = None
               ) -> tuple[list[Event], dict[int, int], int]:
        """New events, the timestamps of the blocks the books need, and the last block's
        (blocking). `upto` stops a catch-up at that block."""
        w3 = self.protocol.backend.w3
        events = cursor.poll()
        if upto is not None:
            events = [e for e in events if e.block <= upto]
        blocks = {e.block for e in events if self.books and self.books.needs_time(e)}
        last = max(cursor.next_block - 1, 0)
        # the last block's time is read once: a poll with no new block (most of them, four a
        # second) read it again, a fifth of the orchestrator's own work in a profile
        known = {self._last_time[0]: self._last_time[1]}
        times = {**known, **_timestamps(w3, sorted((blocks | {last}) - known.keys()))}
        self._last_time = (last, times[last])
        return events, times, times[last]

    @staticmethod
    def _providers(state: State) -> dict[str, str]:
        return {n.address.lower(): n.provider for n in state.nodes()}

    async def follow(self, state: State) -> int:
        """Apply new events to `state`; the cursor moves in the same transaction."""
        events, times, now = await self.run(self._fetch, self.cursor)
        books = self.books
        with state.tx() as db:
            providers = self._providers(state) if events else {}
            for ev in events:
                self._apply(state, ev)
                if books is not None:
                    if ev.name == "NodeJoined" and ev.args["pool"] == self.pool_id:
                        node = state.node(ev.args["node"])
                        if node is not None:
                            providers[node.address.lower()] = node.provider
                            books.joined(node.address, node.provider)
                    books.apply(ev, times.get(ev.block), providers)
            if books is not None:
                books.set_chain_time(now)
            state.set_meta(CURSOR, str(self.cursor.next_block), db)
        await self._resolve(state)
        return len(events)

    async def _resolve(self, state: State) -> None:
        """Read what the books still need from the chain: touched providers' stakes, and the
        status of items an unmatched claim may have covered."""
        books = self.books
        if books is None:
            return
        stakes, claims = books.pending_stakes(), books.pending_claims()
        if not stakes and not claims:
            return
        answers = await self.run(self._read, stakes, claims)
        with state.tx():
            books.resolve(*answers)

    def _read(self, providers: list[str], claims: list[tuple[str, str, list[str]]]
              ) -> tuple[dict[str, int], dict[str, list[str]]]:
        """Stakes of `providers`, and per claim (key, tx, candidates) the candidates it paid
        (blocking)."""
        p = self.protocol
        stakes = {a: p.provider(p.backend.w3.to_checksum_address(a)).stake for a in providers}
        paid: dict[str, list[str]] = {}
        for key, tx, candidates in claims:
            ids = self._claim_ids(tx)
            if ids is None:  # not a direct call (a wallet contract): each item's status
                paid[key] = [w for w in candidates
                             if int(p.work(bytes.fromhex(w)).status) == CLAIMED_CODE]
            else:
                paid[key] = [w for w in candidates if w in ids]
        return stakes, paid

    def _claim_ids(self, tx_hash: str) -> set[str] | None:
        """The work ids a `claim` transaction names, or None if it did not call `claim`."""
        p = self.protocol
        tx = p.backend.w3.eth.get_transaction(tx_hash)
        if str(tx.get("to") or "").lower() != p.contract.address.lower():
            return None
        try:
            fn, args = p.contract.decode_function_input(tx["input"])
        except ValueError:
            return None
        if fn.fn_name != "claim":
            return None
        return {bytes(w).hex() for w in args["work_ids"]}

    def _apply(self, state: State, ev: Event) -> None:
        a = ev.args
        if ev.name in ("NodeJoined", "NodeLeft", "NodeEjected", "NodeBlacklisted"):
            if a["pool"] != self.pool_id:
                return
            node = a["node"]
            if ev.name == "NodeJoined":
                row = state.invite(node)
                provider = row.provider if row else self.protocol.node(node).provider
                state.upsert_node(node, provider, NodeState.HEALTHY, time.time())
                state.drop_invite(node)
            elif state.node(node) is not None:
                state.set_node_state(node, NodeState.EJECTED)
            log_event(log, "node event", event=ev.name, node=node, block=ev.block)
        elif ev.name == "WorkSubmitted":
            self._submitted(state, bytes(a["file_sha256"]).hex(), a)
        elif ev.name == "BatchSubmitted" and a["pool"] == self.pool_id:
            bid = bytes(a["batch_id"]).hex()
            state.batch_seen(bid, a["node"], bytes(a["root"]).hex(), int(a["count"]),
                             int(a["units"]))
            n = apply_batch(state, bid)
            log_event(log, "batch submitted", batch_id=bid, node=a["node"], count=a["count"],
                      files=n)
        elif ev.name == "WorkInvalidated":
            row = state.file_by_work_id(bytes(a["work_id"]).hex())
            if row is not None:
                status = FileStatus.HARD_INVALIDATED if a["hard"] else FileStatus.SOFT_INVALIDATED
                state.set_file_status(row.seq, status, validator=a["validator"])

    def _submitted(self, state: State, sha: str, a: dict[str, Any]) -> None:
        """The granted row of the submitting node moves to `submitted`; any other submission of
        this pool (a file granted to another node, or never granted) gets a row of its own."""
        if a["pool"] != self.pool_id:
            return
        wid, node = bytes(a["work_id"]).hex(), a["node"]
        if state.file_by_work_id(wid) is not None:
            return  # seen before (events are applied once; this keeps it so)
        row = state.file(sha)
        if row is not None and row.node.lower() == node.lower():
            if row.status in (FileStatus.GRANTED, FileStatus.UPLOADED, FileStatus.EXPIRED):
                state.set_file_status(row.seq, FileStatus.SUBMITTED)
                state.set_work_id(row.seq, wid)
            return
        member = state.node(node)
        claim = state.add_claim(sha, node, member.provider if member else "", a["units"], wid)
        log_event(log, "submission of a file this pool did not grant", sha256=sha, node=node,
                  seq=claim.seq, granted_to=row.node if row else None)


def apply_batch(state: State, batch_id: str) -> int:
    """A batch both posted (leaves) and submitted (the chain's count and units, which the
    leaves match): each leaf's file row of its node, named in the batch and not submitted yet,
    moves to `submitted` under the file's own work id (the id a validator opens it under).
    Returns how many rows moved; 0 until both halves are known (inside a transaction)."""
    b = state.batch(batch_id)
    if b is None or not b.submitted or not b.leaves:
        return 0
    leaves = json.loads(b.leaves)
    if len(leaves) != b.count or sum(x["work_units"] for x in leaves) != b.units:
        return 0  # the leaves posted are not what the chain holds (refused at the post)
    moved = 0
    for x in leaves:
        row = state.file(x["sha256"])
        if row is None or row.node.lower() != b.node.lower() or row.batch_id != batch_id:
            continue
        if row.status in (FileStatus.GRANTED, FileStatus.UPLOADED, FileStatus.EXPIRED):
            state.set_file_status(row.seq, FileStatus.SUBMITTED, state.db)
            state.set_work_id(row.seq, work_id(b.node, bytes.fromhex(x["sha256"])).hex())
            moved += 1
    return moved


def _timestamps(w3: Any, blocks: list[int], chunk: int = 500) -> dict[int, int]:
    """Block timestamps, in JSON-RPC batches where the provider takes them (one round trip per
    `chunk` blocks instead of one per block; a burst of submissions is one block each)."""
    out: dict[int, int] = {}
    for i in range(0, len(blocks), chunk):
        part = blocks[i:i + chunk]
        try:
            with w3.batch_requests() as batch:
                for b in part:
                    batch.add(w3.eth.get_block(b))
                got = batch.execute()
            out.update((b, int(blk["timestamp"])) for b, blk in zip(part, got, strict=True))
        except (NotImplementedError, AttributeError, TypeError, ValueError):
            out.update((b, int(w3.eth.get_block(b)["timestamp"])) for b in part)
    return out
