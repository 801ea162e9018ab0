"""The orchestrator of one compute pool: the HTTP API plus four loops (chain events, onboarding,
heartbeat monitor, slot expiry), all on one event loop over one SQLite state.

Start-up after a crash: the state is reopened (nodes, invites, slots, ledger, chain cursor),
partial uploads are deleted, and every live node's miss clock restarts, so the orchestrator's
own downtime never ejects a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiohttp import web
from eth_utils import to_checksum_address
from prometheus_client import CollectorRegistry

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.api import OrchestratorApi, PoolTerms
from meshrl.orchestrator.chainview import ChainView
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.orchestrator.metrics import OrchestratorMetrics
from meshrl.orchestrator.onboarding import Onboarding
from meshrl.orchestrator.pacing import Pacer
from meshrl.orchestrator.state import PoolStep, State
from meshrl.orchestrator.store import DiskFileStore, FileStore
from meshrl.protocol.chain import Protocol
from meshrl.protocol.errors import ChainError, NodeNotInPool
from meshrl.wire.guard import RequestGuard
from meshrl.wire.models import FileStatus, NodeState
from meshrl.wire.nonces import SqliteNonceStore
from meshrl.wire.service import build_app, listen, write_ready_file
from meshrl.wire.signing import orchestrator_audience

__all__ = ["Orchestrator", "missed_heartbeats"]

LIVE_STATES = (NodeState.HEALTHY, NodeState.UNHEALTHY)

log = get_logger("meshrl.orchestrator")


def missed_heartbeats(silence_s: float, interval_s: float, slack: float) -> int:
    """Heartbeats missed after `silence_s` without one: the first is missed `slack` intervals
    after it was due (network jitter is not a failure), each further one an interval later."""
    late = silence_s - interval_s * (1.0 + slack)
    return 0 if late <= 0 else 1 + int(late / interval_s)


class Orchestrator:
    """Builds the parts (state, store, chain view, guard, metrics, the pool's step) and hands
    each of the API and the loops what it uses."""

    def __init__(self, cfg: OrchestratorConfig, protocol: Protocol,
                 store: FileStore | None = None, state: State | None = None) -> None:
        self.cfg, self.protocol = cfg, protocol
        self.manager = protocol.address
        self.state = state or State(cfg.db)
        self.store = store or DiskFileStore(cfg.store.root, fsync=cfg.store.fsync)
        self.chain = ChainView(protocol, cfg.pool_id, cfg.validator_cache_s)
        # seen nonces live in the state's database: a restart does not reopen replays
        # requests signed for another pool's orchestrator (or another chain's) are refused
        self.guard = RequestGuard(cfg.guard, nonces=SqliteNonceStore(self.state.db),
                                  audience=orchestrator_audience(protocol.backend.chain_id,
                                                                 cfg.pool_id),
                                  known=self._known)
        self._readers = {a.lower() for a in [*cfg.readers, self.manager]}
        self.registry = CollectorRegistry()
        self.metrics = OrchestratorMetrics(self.registry)
        self.pool = PoolStep(self.state, cfg.work.step, cfg.rules.async_level)
        self.pacer = Pacer(self.state, self.pool, cfg.work.lease_s,
                           cfg.rules.files_per_step, cfg.work.submit_s,
                           cfg.work.unsubmitted_penalty_s, cfg.work.turnaround_orders,
                           cfg.work.turnaround_window_s)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._blacklisted: set[str] = set()  # nodes known blacklisted on chain (lower case)
        self._step_since = (-1, 0.0, 0.0)  # (step, when it was first seen, last stall line)
        assert protocol.account is not None  # `protocol.address` refused a client without one
        self.onboarding = Onboarding(cfg.onboarding, cfg.pool_id, self.state, self.chain,
                                     protocol.account.key)

    def _known(self, address: str) -> bool:
        """No stranger to this pool (`address` lower case): a reader, the manager, a node it
        has seen join or invited. Such a signer pays no newcomer budget (wire/guard.py), so
        fresh keys flooding in never delay a member's request (its first after a restart)."""
        if address in self._readers:
            return True
        checksummed = to_checksum_address(address)
        return (self.state.node(checksummed) is not None
                or self.state.invite(checksummed) is not None)

    async def terms(self) -> PoolTerms:
        """The pool as the chain has it; refuses to serve a pool this key does not manage."""
        pool = await self.chain.run(self.protocol.pool, self.cfg.pool_id)
        if pool.manager.lower() != self.manager.lower():
            raise RuntimeError(f"{self.manager} is not the manager of pool {self.cfg.pool_id}")
        # the chain refuses a file claiming more units than the pool allows: say so up front
        return PoolTerms(pool.domain, min(self.cfg.work.max_units_per_file, pool.max_units))

    async def start(self) -> None:
        terms = await self.terms()
        self.chain.restore_cursor(self.state)
        await self.chain.open_books(self.state)
        revived = self.state.grace(time.time())
        self.state.reset_uploads()  # slots a kill left `uploading`: free to finish the upload
        api = OrchestratorApi(self.cfg, terms, self.state, self.store, self.pool, self.chain,
                              [*self.cfg.readers, self.manager], self.metrics, self.guard,
                              self.pacer)
        app = build_app("orchestrator", api.routes(), self.guard, registry=self.registry)
        self._runner, self.url = await listen(app, self.cfg.host, self.cfg.port)
        for loop in (self._follow_chain, self._monitor, self._expire_slots, self.onboarding.run,
                     self._watch_step):
            self._tasks.append(asyncio.create_task(self._forever(loop)))
        log_event(log, "orchestrator listening", url=self.url, pool=self.cfg.pool_id,
                  step=self.pool.step, nodes_resumed=revived,
                  cursor=self.chain.cursor.next_block)
        write_ready_file(self.cfg.ready_file, self.url)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._runner is not None:
            await self._runner.cleanup()
        await self.onboarding.close()
        self.chain.close()
        self.state.close()

    async def _forever(self, step: Any) -> None:
        """Run one loop body forever; an error is logged and retried, never fatal."""
        while True:
            try:
                delay = await step()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log_event(log, "loop error", loop=step.__name__, error=repr(e))
                delay = 2.0
            await asyncio.sleep(delay)

    async def _follow_chain(self) -> float:
        await self.chain.follow(self.state)
        if self.cfg.blacklist_fraud:
            await self._blacklist_fraud()
        return self.cfg.chain_poll_s

    async def _blacklist_fraud(self) -> None:
        """Every node with hard-invalidated work is blacklisted here. Read from the ledger on
        each poll (not from the event), so a crash between the two cannot skip a node."""
        for node in self.state.nodes_with(FileStatus.HARD_INVALIDATED):
            if node.lower() in self._blacklisted:
                continue
            try:
                await self.chain.blacklist(node)
            except ChainError as e:  # tried again on the next poll
                log_event(log, "blacklist failed", node=node, error=str(e))
                continue
            self._blacklisted.add(node.lower())
            log_event(log, "node blacklisted", node=node, reason="hard-invalidated work")

    async def _watch_step(self) -> float:
        """While the pool's step stands still, say every `work.stall_log_s` what it has and
        what it lacks: the members, this step's files by status, and whether the members
        reached their files-per-step limit (then only the trainer's next step frees them)."""
        every, now, step = self.cfg.work.stall_log_s, time.monotonic(), self.pool.step
        seen, since, said = self._step_since
        if step != seen:
            self._step_since = (step, now, now)
            return min(every, 5.0)
        if now - said < every:
            return min(every, 5.0)
        self._step_since = (step, since, now)
        rows = self.state.files(step, None, 0, 1_000_000)  # files of version = the step
        by_status: dict[str, int] = {}
        per_node: dict[str, int] = {}
        for r in rows:
            by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
            if r.granted:
                per_node[r.node.lower()] = per_node.get(r.node.lower(), 0) + 1
        members = self.state.nodes(LIVE_STATES)
        limit = self.cfg.rules.files_per_step
        full = [m.address for m in members if limit and per_node.get(m.address.lower(), 0)
                >= limit]
        why = []
        if not members:
            why.append("no live members")
        elif limit and len(full) == len(members):
            cap = len(members) * limit * self.cfg.rules.prompts_per_file
            why.append(f"every member made its {limit} files of this step ({cap} prompts in "
                       "all): the step can move only if the trainer has enough of them "
                       "accepted")
        pace = self.pacer.status(time.monotonic())
        if pace["ahead"] is not None:
            made = pace["backlog"] + pace["leases"]
            why.append(f"pacing: {pace['backlog']} files in flight or waiting and "
                       f"{pace['leases']} being made of the {pace['ahead']} the trainer wants "
                       "ahead" + (" (met: members wait for the trainer to take some)"
                                  if made >= pace["ahead"] else ""))
        if by_status.get(FileStatus.SUBMITTED.value):
            why.append(f"{by_status[FileStatus.SUBMITTED.value]} files await a verdict")
        log_event(log, "pool step waiting", step=step, still_s=round(now - since, 1),
                  members=len(members), members_at_limit=len(full), files=by_status,
                  pacing=pace,
                  why="; ".join(why) or "members are generating")
        return min(every, 5.0)

    async def _expire_slots(self) -> float:
        self.state.expire_slots(time.time())
        self._refresh_gauges()
        return 5.0

    async def _monitor(self) -> float:
        """healthy → unhealthy (one heartbeat missed) → dead (K missed) → ejected on chain."""
        hb = self.cfg.heartbeat
        now = time.time()
        live = (NodeState.HEALTHY, NodeState.UNHEALTHY, NodeState.DEAD)
        for node in self.state.nodes(live):
            missed = missed_heartbeats(now - node.last_seen, hb.interval_s, hb.slack)
            if missed >= hb.dead_after:
                await self._bury(node.address, missed)
            elif missed >= 1 and node.state is NodeState.HEALTHY:
                self.state.set_node_state(node.address, NodeState.UNHEALTHY)
        return min(1.0, hb.interval_s / 4)

    async def _bury(self, node: str, missed: int) -> None:
        self.state.set_node_state(node, NodeState.DEAD)
        chain = "ejection off"
        if self.cfg.heartbeat.eject:
            try:
                await self.chain.eject(node)
                chain = "ok"
            except NodeNotInPool:
                chain = "out of the pool already"
            except ChainError as e:
                chain = f"failed: {e}"
        current = self.state.node(node)
        if current is not None and current.state is NodeState.DEAD:  # no heartbeat meanwhile
            self.state.set_node_state(node, NodeState.EJECTED)
        self.metrics.ejections.inc()
        log_event(log, "node ejected", node=node, missed=missed, chain=chain)

    def _refresh_gauges(self) -> None:
        for s in NodeState:
            self.metrics.nodes.labels(s.value).set(len(self.state.nodes((s,))))
        for status, n in self.state.count_files().items():
            self.metrics.files.labels(status.value).set(n)
        self.metrics.signature_seconds.set(self.guard.verify_seconds)
