"""The orchestrator's view of the chain: checks on candidates and validators, ejection, invites,
and the event follower that moves the ledger and the node table.

web3 calls block, so they run on one worker thread (which also keeps this process's
transactions in nonce order); the event loop only awaits them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.state import POOL_STEP, State
from meshrl.protocol.chain import Protocol
from meshrl.protocol.errors import ChainError, TxReverted
from meshrl.protocol.events import Event
from meshrl.wire.models import FileStatus, NodeState

__all__ = ["ChainView", "Eligibility"]

log = get_logger("meshrl.orchestrator.chain")
T = TypeVar("T")
ZERO = "0x" + "00" * 20
CURSOR = "chain_cursor"


class Eligibility:
    """Why a candidate may (reason "") or may not be invited."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def __bool__(self) -> bool:
        return not self.reason


class ChainView:
    def __init__(self, protocol: Protocol, pool_id: int, validator_cache_s: float) -> None:
        self.protocol, self.pool_id = protocol, pool_id
        self.cache_s = validator_cache_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="chain")
        self._validators: dict[str, tuple[bool, float]] = {}
        self.cursor = protocol.events()

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
        not blacklisted here (blocking; call through `run`)."""
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
        return Eligibility()

    def make_invite(self, node: str, ttl_s: int) -> tuple[int, int, str, int]:
        """(nonce, expiry, signature hex, domain) of a fresh invite (blocking)."""
        nonce = secrets.randbits(63)
        # the latest block may be old on a quiet chain: count from whichever clock is later
        expiry = max(self.protocol.backend.now(), int(time.time())) + ttl_s
        sig = self.protocol.sign_invite(self.pool_id, node, nonce, expiry)
        return nonce, expiry, "0x" + sig.hex(), self.protocol.pool(self.pool_id).domain

    async def eject(self, node: str) -> str:
        """Eject `node` on chain; "" on success, else why not (already gone, chain error)."""
        try:
            await self.run(self.protocol.eject_node, self.pool_id, node)
            return ""
        except (TxReverted, ChainError) as e:
            return str(e)

    async def blacklist(self, node: str) -> str:
        """Blacklist `node` in this pool (ejecting it if still in); "" on success or if it
        already is, else why not (chain error)."""
        try:
            if not await self.run(self.protocol.is_blacklisted, self.pool_id, node):
                await self.run(self.protocol.blacklist_node, self.pool_id, node)
            return ""
        except (TxReverted, ChainError) as e:
            return str(e)

    def restore_cursor(self, state: State) -> None:
        saved = state.get_meta(CURSOR)
        if saved:
            self.cursor.next_block = int(saved)

    async def follow(self, state: State) -> int:
        """Apply new events to `state`; the cursor moves in the same transaction."""
        events = await self.run(self.cursor.poll)
        with state.tx() as db:
            for ev in events:
                self._apply(state, ev)
            state.set_meta(CURSOR, str(self.cursor.next_block), db)
        return len(events)

    def _apply(self, state: State, ev: Event) -> None:
        a = ev.args
        if ev.name in ("NodeJoined", "NodeLeft", "NodeEjected", "NodeBlacklisted"):
            if a["pool"] != self.pool_id:
                return
            node = a["node"]
            if ev.name == "NodeJoined":
                row = state.invite(node)
                provider = row[0] if row else self.protocol.node(node).provider
                state.upsert_node(node, provider, NodeState.HEALTHY, time.time())
                state.drop_invite(node)
            elif state.node(node) is not None:
                state.set_node_state(node, NodeState.EJECTED)
            log_event(log, "node event", event=ev.name, node=node, block=ev.block)
        elif ev.name == "WorkSubmitted":
            self._submitted(state, bytes(a["file_sha256"]).hex(), a)
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
        claim = state.add_claim(sha, node, member.provider if member else "", a["units"], wid,
                                int(state.get_meta(POOL_STEP, "0")))
        log_event(log, "submission of a file this pool did not grant", sha256=sha, node=node,
                  seq=claim.seq, granted_to=row.node if row else None)
