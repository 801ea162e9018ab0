# over 400 lines: the node's life read top to bottom (check, onboard, generate, deliver), one phase
#  a method
"""The worker process: check, onboard, then generate -> outbox -> upload -> submit, forever.

Reads top to bottom as the node's life: `run` checks the machine, onboards (chain, discovery,
invite), starts the heartbeat and policy-follower tasks, delivers whatever a previous run left in
the outbox, then loops over `work_once`. Generation runs in a thread so heartbeats and policy
downloads continue meanwhile; a new policy version is swapped into the engine between two files
(`load_weights` is atomic, so generation stops only for the load itself). With `claim_every_s`
a claimer task claims this provider's rewards (claims.py). SIGTERM / Ctrl-C set `stop`: a file
being generated is dropped (generation, chain reads and policy loads run in daemon threads,
`wire/detached.py`, that nothing waits for), the node leaves the pool on chain when
`leave_on_stop`, then the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from meshrl.durable import atomic_write
from meshrl.inference.device import DeviceError
from meshrl.log import get_logger, log_event
from meshrl.pool import Assignment, PoolRules, WorkOrder, require_same_rules
from meshrl.protocol import Deployment, Protocol
from meshrl.protocol.errors import ChainError, NodeNotInPool, TxReverted
from meshrl.protocol.history import provider_rewards
from meshrl.protocol.local import connect
from meshrl.wire import NotAuthorized, NotInPool, SignedClient, Transient, WireHTTPError
from meshrl.wire.detached import detached
from meshrl.wire.models import Heartbeat, HeartbeatAck
from meshrl.wire.rollout_file import rollout_file_bytes
from meshrl.worker.claims import Claimer
from meshrl.worker.config import WorkerConfig
from meshrl.worker.courier import ChainCourier
from meshrl.worker.defense import Defender
from meshrl.worker.delivery import Courier, RetryLater, deliver_all
from meshrl.worker.hardware import missing, probe
from meshrl.worker.join import JoinError, check_clock, fetch_manifest
from meshrl.worker.keys import WorkerKeys
from meshrl.worker.onboard import announce_and_join, onboard_chain
from meshrl.worker.outbox import Outbox, OutboxEntry
from meshrl.worker.parts import MadeFile, Parts
from meshrl.worker.policy import PolicyHolder, VersionMoved
from meshrl.worker.profile import accepted_rules
from meshrl.worker.retry import retrying
from meshrl.worker.status import StatusLine

__all__ = ["HardwareError", "WorkerNode"]

log = get_logger("meshrl.worker")
T = TypeVar("T")


class HardwareError(RuntimeError):
    """The machine does not meet the pool's requirements (the message lists what is missing)."""


class WorkerNode:
    def __init__(self, cfg: WorkerConfig, keys: WorkerKeys, parts: Parts | None = None) -> None:
        """`parts`: what makes its files (backend, rollouts, file maker, courier); the honest
        ones unless an adversary of tests and demos hands its own (`meshrl.adversaries`)."""
        self.cfg, self.keys = cfg, keys
        self.work_dir = Path(cfg.work_dir)
        self.outbox = Outbox(self.work_dir / "outbox")
        self.parts = parts or Parts()
        self.make_file = self.parts.file_maker(self._make_file, self.outbox)
        self.stop = asyncio.Event()
        self.order: WorkOrder | None = None
        self.pool_step = 0
        self.files_done = 0
        self.tokens_per_s = 0.0
        self.policy: PolicyHolder | None = None
        self.state = "starting"  # for the live status line
        self._paced_s = 0.0  # the wait between work orders while paced (`_idle_wait`)
        self._delivering = asyncio.Lock()
        self.claimer: Claimer | None = None
        self.defender: Defender | None = None
        self.signalled = False  # stopped by SIGTERM / Ctrl-C (not by max_files)

    # ---- life ----------------------------------------------------------------------------
    async def run(self) -> int:
        self._install_signals()
        try:
            hw = probe(self.work_dir, self.cfg.hardware.python_packages, self.cfg.device,
                       self.cfg.dtype)
        except DeviceError as e:  # one line: this machine cannot compute where it was told
            raise HardwareError(str(e)) from None
        log_event(log, "compute device", backend=self.cfg.backend, **(hw.compute or {}))
        lacking = missing(hw, self.cfg.hardware)
        if lacking:
            raise HardwareError("this machine does not meet the pool's requirements: "
                                + "; ".join(lacking))
        await self._check_clock()
        async with SignedClient(self.cfg.orchestrator_url, self.keys.node.key,
                                timeout_s=self.cfg.http_timeout_s) as orch:
            rules = await accepted_rules(orch, self.cfg, self.stop)  # before anything is staked
            if rules is None:
                return 0
            self.rules: PoolRules = rules
            self.tasks = rules.task.build()  # once: a math task reads its data file here
            backend = await retrying("chain", lambda: asyncio.to_thread(connect, self.cfg.chain),
                                     self.stop)
            chain = Protocol(backend, Deployment.load(self.cfg.chain.deployment))
            self.state = "onboarding"
            steps = await retrying("onboarding", lambda: asyncio.to_thread(
                onboard_chain, chain, self.keys, self.cfg), self.stop)
            log_event(log, "on chain", steps=steps, node=self.keys.node.address)
            self.join = lambda: retrying("joining", lambda: announce_and_join(
                chain, self.keys, self.cfg, hw, orch, self.stop), self.stop)
            self.state = "joining"
            log_event(log, "pool", status=await self.join())
            self.state = "working"
            beats = asyncio.create_task(self._heartbeats(orch))  # from now on: alive
            status = StatusLine(enabled=None if self.cfg.status_line == "auto"
                                else self.cfg.status_line == "on")
            tasks = [beats, asyncio.create_task(status.run(self, lambda: provider_rewards(
                chain, self.cfg.pool_id, self.keys.provider.address), self.stop))]
            which = self.parts.challenges(self.cfg.challenge_verdicts)
            if which != "off":  # an honest provider is never silent under a false verdict
                self.defender = Defender(chain.as_(self.keys.provider), self.keys.node.address,
                                         self.cfg.watch_verdicts_s, which)  # type: ignore[arg-type]
                tasks.append(asyncio.create_task(self.defender.run(self.stop)))
            if self.cfg.claim_every_s > 0:  # this process owns the provider key's nonce
                self.claimer = Claimer(chain.as_(self.keys.provider), self.cfg.pool_id,
                                       self.cfg.claim_every_s, self.cfg.claim_batch)
                tasks.append(asyncio.create_task(self.claimer.run(self.stop)))
            try:
                # the first policy fetch has no deadline of its own (a source may accept and
                # never answer): it ends with a stop like every other wait
                self.order = await self._unless_stopped(self._work_order(orch))
                if self.order is not None:
                    self.policy = await self._unless_stopped(
                        PolicyHolder.start(self.cfg, self.order, self.parts))
                if self.order is not None and self.policy is not None:
                    tasks.append(asyncio.create_task(self.policy.follow(
                        self.order.shardcast_servers, self.stop)))
                    courier = self.parts.courier(ChainCourier(
                        orch, chain, self.keys.provider, self.keys.node.address,
                        self.cfg.pool_id, self.outbox, pause=self._pause))
                    await self._deliver(courier)  # what a previous run left behind
                    if self.rules.batch.files > 1:
                        tasks.append(asyncio.create_task(self._send_due_batches(courier)))
                    while not self.stop.is_set() and not self._enough():
                        await self.work_once(orch, courier)
                    if self.rules.batch.files > 1 and len(self.outbox):
                        # a partial batch is not left waiting for a next run (bounded)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._deliver(courier, flush=True),
                                                   self.cfg.http_timeout_s)
            finally:
                self.stop.set()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if self.signalled and self.cfg.leave_on_stop:
                    await self._leave(chain)
        log_event(log, "stopped", files=self.files_done,
                  claimed=None if self.claimer is None else self.claimer.claimed)
        return 0

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()

        def stop() -> None:
            self.signalled = True
            self.stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)

    async def _leave(self, chain: Protocol) -> None:
        """Take the node out of the pool on chain (one attempt, bounded: a pool that does not
        hear of it ejects the node after missed heartbeats anyway)."""
        me, node = chain.as_(self.keys.node), self.keys.node.address
        self.state = "leaving"
        try:
            info = await asyncio.wait_for(detached(me.node, node),
                                          self.cfg.http_timeout_s)
            if info.pool != self.cfg.pool_id:
                log_event(log, "not in the pool", pool=self.cfg.pool_id, now_in=info.pool)
                return
            r = await asyncio.wait_for(detached(me.leave_pool, node),
                                       self.cfg.http_timeout_s)
        except (ChainError, TimeoutError) as e:
            log_event(log, "leave failed", error=f"{type(e).__name__}: {e}"[:300])
            return
        log_event(log, "left the pool", pool=self.cfg.pool_id, tx=r.tx_hash,
                  files_pending=len(self.outbox))

    def _enough(self) -> bool:
        return self.cfg.max_files > 0 and self.files_done >= self.cfg.max_files

    # ---- one file ------------------------------------------------------------------------
    async def work_once(self, orch: SignedClient, courier: Courier) -> None:
        if self.cfg.max_files > 0 and self.files_done + len(self.outbox) >= self.cfg.max_files:
            # made enough: what waits for its batch is sent now (a partial batch)
            await self._deliver(courier, flush=True)
            if not self._enough():
                await self._sleep(self.cfg.poll_interval)
            return
        if self.policy is not None:
            self.policy.loaded.clear()  # a version loaded from now on ends the idle wait
        asked, partial = time.monotonic(), self._partial_batch()
        # a partial batch waits: a quick look first (not held). A pool that wants no other
        # file from this node now would hold the order while the batch waits out its delay
        # for a file that cannot come: it goes now instead (issue 46: each step of the
        # batched network demo waited the 0.5 s delay this way, ~1.65 files a batch)
        order = await self._unless_stopped(self._work_order(
            orch, 0.0 if partial else self.cfg.work_wait_s))
        if order is None:  # stopped during the pool's long poll: nothing asked is lost
            return
        self.order = order
        if partial and order.files_wanted == 0:
            await self._deliver(courier, flush=True)
            if self._partial_batch():  # not sent (postponed): not a tight loop of looks
                await self._idle(self._idle_wait(order))
            return  # the next order is held as before: nothing waits for a batch now
        # a file being generated when the stop comes is dropped (its counter is not used
        # again): a real model's file may take minutes, and a stop must not wait for it
        made = await self._unless_stopped(self.make_file(order))
        if self.stop.is_set():
            return
        if made is None:
            # a delivery postponed (link down), or a partial batch waiting for its delay:
            # retried while idle too
            if len(self.outbox):
                await self._deliver(courier)
            # an order the pool held has waited already; one answered at once (this node must
            # load a newer version first, or the pool does not hold) is waited for here, until
            # the next version is loaded at the latest
            await self._idle(self._idle_wait(order) - (time.monotonic() - asked))
            return
        self._paced_s = 0.0
        entry, data = made
        self.outbox.put(data, entry)
        log_event(log, "file written", sha256=entry.sha256,
                  counter=entry.counter, version=entry.policy_version, units=entry.work_units)
        await self._pause("written", entry)
        await self._deliver(courier)

    async def _make_file(self, order: WorkOrder) -> MadeFile | None:
        """The next file of the version held; None when there is none to make now."""
        version = self.policy.version
        if version not in order.policy_versions:
            if time.monotonic() - getattr(self, "_said_policy", -1e9) > 30.0:  # not silent
                self._said_policy = time.monotonic()
                log_event(log, "waiting for a policy version", have=version,
                          allowed=order.policy_versions, step=order.step)
            return None  # the follower is fetching a newer one
        if order.files_wanted == 0:  # paced: the pool has what the trainer will take
            if time.monotonic() - getattr(self, "_said_paced", -1e9) > 30.0:  # not silent
                self._said_paced = time.monotonic()
                log_event(log, "waiting: the pool wants no file now", why=order.waiting,
                          step=order.step)
            self.state = "paced"
            return None
        self.state = "working"
        # a file is of the version it is generated with: each version's counters
        # 0 .. files_per_step - 1 are the only work it offers, so no choice of version can
        # pick among generations of one piece of work
        if self._made(version) >= order.rules.files_per_step:
            return None  # this version's counters are used: wait for the next one
        counter = self._next_counter(version)
        a = Assignment(self.rules, self.keys.node.address, counter, version)
        t0 = time.perf_counter()
        try:
            rf = await detached(self.policy.generate, a, self.tasks,
                                         self.keys.provider.address)
        except VersionMoved:
            return None  # a newer version arrived meanwhile: its counters next time
        tokens = sum(len(c.completion_tokens) for c in rf.completions)
        self.tokens_per_s = tokens / max(1e-9, time.perf_counter() - t0)
        data = rollout_file_bytes(rf)
        await self._pause("generated", None)  # in memory only: a crash here loses the work
        h = rf.header
        return OutboxEntry(hashlib.sha256(data).hexdigest(), len(data), counter,
                           h.policy_version, h.work_units), data

    def _idle_wait(self, order: WorkOrder) -> float:
        """Seconds until the next work order: `poll_interval`, doubled while the pool keeps
        wanting no file (paced), up to 4x, so idle members do not sign a request each poll."""
        if order.files_wanted != 0:
            self._paced_s = 0.0
            return self.cfg.poll_interval
        self._paced_s = min(4 * self.cfg.poll_interval,
                            2 * (self._paced_s or self.cfg.poll_interval / 2))
        return self._paced_s

    def _partial_batch(self) -> bool:
        """Whether an uploaded file waits for its batch to fill (a pool that batches)."""
        if self.rules.batch.files <= 1:
            return False
        inside = self.outbox.batched()
        return any(e.sha256 not in inside for e in self.outbox.pending())

    async def _send_due_batches(self, courier: Courier) -> None:
        """A partial batch goes out when its oldest file has waited `batch.max_delay_s`, also
        while this worker waits on the pool's long poll for its next order or generates a
        file (otherwise only a next file or an idle turn sends it: measured on the network
        demo, files waited ~6 s for a 2 s rule, and the trainer with them)."""
        rule = self.rules.batch
        while not self.stop.is_set():
            inside = self.outbox.batched()
            waiting = [e.created for e in self.outbox.pending() if e.sha256 not in inside]
            due = min(waiting) + rule.max_delay_s if waiting else math.inf
            if time.time() < due:
                await self._sleep(max(0.05, min(due - time.time(), self.cfg.poll_interval)))
                continue
            try:
                await self._deliver(courier)
            except Exception as e:  # the loop's own next delivery meets it too, and acts
                log_event(log, "timed delivery failed", error=f"{type(e).__name__}: {e}"[:300])
            inside = self.outbox.batched()
            if min(waiting) in [e.created for e in self.outbox.pending()
                                if e.sha256 not in inside]:
                await self._sleep(self.cfg.poll_interval)  # not sent: not a tight loop
            # sent: the next file's own delay is waited from here, not a poll interval more

    async def _deliver(self, courier: Courier, flush: bool = False) -> None:
        async with self._delivering:  # one delivery at a time (the timer above, the loop)
            await self._deliver_now(courier, flush)

    async def _deliver_now(self, courier: Courier, flush: bool) -> None:
        order = self.order
        assert order is not None
        try:
            counts = await deliver_all(self.outbox, courier, order.step, order.rules.async_level,
                                       self._pause, self.rules.batch, time.time(), flush)
        except RetryLater as e:
            log_event(log, "delivery postponed", reason=str(e))
            return
        except (WireHTTPError, OSError, ChainError) as e:
            # the orchestrator is down or restarting (the outbox keeps every file, each phase
            # is resumed next time), or this node was ejected (refused by the orchestrator or
            # by the chain): the next work-order poll rejoins, or stops for good if the pool
            # blacklisted it; a chain transport error (an RPC link down) is waited out too
            if isinstance(e, WireHTTPError) and not isinstance(e, NotAuthorized | Transient):
                raise
            if isinstance(e, TxReverted) and not isinstance(e, NodeNotInPool):
                raise
            log_event(log, "delivery postponed", reason=str(e))
            await self._sleep(self.cfg.poll_interval)
            return
        self.files_done += counts["sent"]
        if counts["sent"] or counts["dropped"]:
            log_event(log, "delivered", **counts, total=self.files_done)

    # ---- state ---------------------------------------------------------------------------
    def _made(self, version: int) -> int:
        """Files generated with policy version `version` so far (the counters taken)."""
        path = self.work_dir / "counters.json"
        counters: dict[str, int] = json.loads(path.read_text()) if path.is_file() else {}
        return counters.get(str(version), 0)

    def _next_counter(self, version: int) -> int:
        """A counter never used before at this version (persisted before generation starts)."""
        path = self.work_dir / "counters.json"
        counters: dict[str, int] = json.loads(path.read_text()) if path.is_file() else {}
        used = [e.counter for e in self.outbox.pending() if e.policy_version == version]
        used += [r["counter"] for r in self.outbox.sent() if r["policy_version"] == version]
        counter = max([counters.get(str(version), 0), *(c + 1 for c in used)])
        counters[str(version)] = counter + 1
        atomic_write(path, json.dumps(counters).encode())
        return counter

    async def _work_order(self, orch: SignedClient, wait: float = 0.0) -> WorkOrder:
        """The pool's work order, saying which version this node holds; with `wait` the pool
        may hold it up to that long while it wants no file from this node."""
        while True:
            # held below the request's own timeout, so a held answer is never a timeout
            query: dict[str, Any] = {"wait": min(wait, self.cfg.http_timeout_s / 2)}
            if self.policy is not None:
                query["version"] = self.policy.version
            try:
                order = await orch.call("GET", "/work", response=WorkOrder, query=query)
                require_same_rules(self.rules, order.rules)  # a change stops this worker
                self.pool_step = order.step
                return order
            except (WireHTTPError, OSError) as e:
                log_event(log, "no work order yet", error=str(e))
                if self.stop.is_set():
                    raise
                if isinstance(e, NotInPool):
                    self.state = "rejoining"  # ejected (missed heartbeats): invited and joined
                    log_event(log, "pool", status=await self.join())  # again
                    self.state = "working"
                await self._sleep(self.cfg.poll_interval)

    async def _heartbeats(self, orch: SignedClient) -> None:
        while not self.stop.is_set():
            version = -1 if self.policy is None else self.policy.version
            hb = Heartbeat(policy_version=version, step=self.pool_step,
                           tokens_per_s=self.tokens_per_s, files_pending=len(self.outbox))
            try:
                ack: Any = await orch.call("POST", "/heartbeat", hb, response=HeartbeatAck)
                self.pool_step = ack.step
            except (WireHTTPError, OSError) as e:
                log_event(log, "heartbeat failed", error=str(e))
            await self._sleep(self.cfg.heartbeat_interval)

    async def _check_clock(self) -> None:
        """Refuse to start (`ClockSkew`, one line) with a clock the pool's signature window
        would refuse; an orchestrator without `GET /join` or not answering is not checked."""
        try:
            m, offset = await fetch_manifest(self.cfg.orchestrator_url, self.cfg.http_timeout_s)
        except JoinError as e:
            log_event(log, "clock not checked", reason=str(e))
            return
        check_clock(offset, m.signature_window_s)
        log_event(log, "clock checked", offset_s=round(offset, 2), window_s=m.signature_window_s)

    async def _pause(self, phase: str, entry: OutboxEntry | None) -> None:
        """crash tests: hold still at a phase boundary so a test can kill -9 the process."""
        only = self.cfg.crash_test_phase
        if self.cfg.crash_test_pause > 0 and only in ("", phase):
            log_event(log, "crash-test pause", phase=phase,
                      sha256=None if entry is None else entry.sha256)
            await asyncio.sleep(self.cfg.crash_test_pause)

    async def _unless_stopped(self, aw: Awaitable[T]) -> T | None:
        """`aw`'s result, or None when `stop` comes first (`aw` is then cancelled)."""
        task = asyncio.ensure_future(aw)
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            stopped.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _idle(self, seconds: float) -> None:
        """Sleep up to `seconds`, ended early by `stop` or a newly loaded policy version."""
        if seconds <= 0:
            return
        wakers = [asyncio.ensure_future(self.stop.wait())]
        if self.policy is not None:
            wakers.append(asyncio.ensure_future(self.policy.loaded.wait()))
        try:
            await asyncio.wait(wakers, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in wakers:
                w.cancel()
