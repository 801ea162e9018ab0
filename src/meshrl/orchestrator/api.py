# over 400 lines: one thin handler per route of the orchestrator's API; splitting them would scatter
#  the route table
"""The orchestrator's HTTP API: one handler per route, each a thin layer over `State`, the file
store and the chain view. Who may call what:

| route | caller |
| --- | --- |
| `GET /health`, `GET /rules`, `GET /join` | anyone (unsigned) |
| `GET /invite` | a candidate node |
| `POST /heartbeat`, `GET /work`, `POST /uploads`, `PUT /uploads/{slot}`, `POST /batches` | member |
| `POST /verdicts` | an address with the validator role on chain |
| `GET /ledger`, `GET /files/{sha256}`, `GET /batches/{id}` | readers, validators, the manager |
| `GET /nodes`, `POST /step` | readers (the trainer) and the manager |

The API holds exactly the parts it reads (no back-pointer to the `Orchestrator` that builds
it), so a test can serve its routes from a state and a store of its own.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from meshrl.orchestrator.books import NodeMoney
from meshrl.orchestrator.chainview import ChainView, apply_batch
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.orchestrator.hold import HoldGate, hold
from meshrl.orchestrator.join import ChainFacts, JoinDesk, JoinUnavailable, read_chain_facts
from meshrl.orchestrator.metrics import OrchestratorMetrics
from meshrl.orchestrator.pacing import Pacer, Want
from meshrl.orchestrator.state import FileRow, Grant, PoolStep, SlotUse, State
from meshrl.orchestrator.store import (
    FileStore,
    StoreRefusal,
    check_sha,
    check_slot_id,
    parquet_framed,
)
from meshrl.pool import JoinManifest, PoolRules, WorkOrder, WorkQuery, counter_refusal
from meshrl.protocol.batches import Batch, Leaf
from meshrl.wire.errors import ErrorCode, WireError
from meshrl.wire.guard import RequestGuard
from meshrl.wire.models import (
    BatchInfo,
    BatchLeaf,
    BatchPost,
    FileStatus,
    Health,
    Heartbeat,
    HeartbeatAck,
    Invite,
    LedgerEntry,
    LedgerPage,
    LedgerQuery,
    NodeState,
    PoolNode,
    PoolNodes,
    SlotRequest,
    StepUpdate,
    UploadReceipt,
    UploadSlot,
    Verdict,
    VerdictAck,
    VerdictKind,
)
from meshrl.wire.service import Call, Route

__all__ = ["OrchestratorApi", "PoolTerms"]

LIVE = (NodeState.HEALTHY, NodeState.UNHEALTHY)
# ledger rows whose submission the chain's `WorkSubmitted` event has not reached yet
_BEFORE_SUBMISSION = (FileStatus.GRANTED, FileStatus.UPLOADED, FileStatus.EXPIRED)


_BATCH_ID = re.compile(r"^[0-9a-f]{64}$")

_GRANT_REFUSALS = {Grant.UPLOADED: ErrorCode.FILE_ALREADY_UPLOADED,
                   Grant.KNOWN: ErrorCode.FILE_ALREADY_KNOWN,
                   Grant.COUNTER_USED: ErrorCode.COUNTER_USED}


@dataclass(frozen=True)
class PoolTerms:
    """What the chain says of the pool, read once at start: its domain (named in invites) and
    the work units one file may claim (the pool's and the config's limit, the lower)."""

    domain: int
    max_units: int


class OrchestratorApi:
    """The handlers over the parts they read; `routes()` declares them for `build_app`.

    `readers` may read the ledger, the files and the nodes and move the step (the config's
    readers and the pool's manager); validators, known by their role on `chain`, may read
    and post verdicts. `guard`'s counters are reported in `/health`."""

    def __init__(self, cfg: OrchestratorConfig, terms: PoolTerms, state: State,
                 store: FileStore, pool: PoolStep, chain: ChainView, readers: Iterable[str],
                 metrics: OrchestratorMetrics, guard: RequestGuard,
                 pacer: Pacer | None = None) -> None:
        self.cfg, self.terms, self.state, self.store = cfg, terms, state, store
        self.pacer = pacer or Pacer(state, pool, cfg.work.lease_s, cfg.rules.files_per_step,
                                    cfg.work.submit_s, cfg.work.unsubmitted_penalty_s,
                                    cfg.work.turnaround_orders, cfg.work.turnaround_window_s)
        self.holds = HoldGate(cfg.work.max_held_per_signer, cfg.work.max_held_per_ip)
        # held ledger reads of one query share its rows until the ledger changes:
        # query -> rows, valid for the files alarm's generation `_ledger_gen`
        self._ledger_rows: dict[tuple[Any, ...], list[FileRow]] = {}
        self._ledger_gen = -1
        self.pool, self.chain, self.metrics, self.guard = pool, chain, metrics, guard
        self.readers = frozenset(a.lower() for a in readers)
        self.published = PoolRules(pool_id=cfg.pool_id, **dict(cfg.rules))  # served as is
        manager = chain.protocol.account  # the manager's key signs the join manifest
        self.join_desk = JoinDesk(cfg, self.published, cfg.readers,
                                  key=None if manager is None else manager.key,
                                  signer="" if manager is None else manager.address)

    def member(self, call: Call) -> str:
        node = self.state.node(call.address)
        if node is None or node.state not in LIVE:
            raise WireError(ErrorCode.NOT_IN_POOL, "join the pool with an invite first")
        return node.address

    async def reader(self, call: Call) -> str:
        addr = call.address
        if addr.lower() in self.readers or await self.chain.is_validator(addr):
            return addr
        raise WireError(ErrorCode.NOT_A_READER)

    def trainer(self, call: Call) -> str:
        if call.address.lower() in self.readers:
            return call.address
        raise WireError(ErrorCode.NOT_A_READER)

    def health_info(self) -> dict[str, Any]:
        return {"pool_id": self.cfg.pool_id, "step": self.pool.step,
                "nodes": {s.value: len(self.state.nodes((s,))) for s in NodeState},
                "files": self.state.count_files(), "chain_block": self.chain.cursor.next_block,
                "pacing": self.pacer.status(time.monotonic()),
                "signatures": {"verified": self.guard.verified,
                               "seconds": round(self.guard.verify_seconds, 6)}}

    async def health(self, call: Call) -> Health:
        return Health(service="orchestrator", info=self.health_info())

    async def invite(self, call: Call) -> Invite:
        row = self.state.invite(call.address)
        if row is None or row.expiry < time.time():
            raise WireError(ErrorCode.NO_INVITE)
        return Invite(pool_id=self.cfg.pool_id, domain_id=self.terms.domain, node=call.address,
                      nonce=row.nonce, expiry=row.expiry, signature=row.signature)

    async def heartbeat(self, call: Call) -> HeartbeatAck:
        node = self.member(call)
        hb: Heartbeat = call.body
        self.state.heartbeat(node, time.time(), hb.policy_version, hb.step, hb.tokens_per_s,
                             hb.files_pending)
        self.metrics.heartbeats.inc()
        return HeartbeatAck(state=NodeState.HEALTHY, interval_s=self.cfg.heartbeat.interval_s,
                            step=self.pool.step)

    async def work(self, call: Call) -> WorkOrder:
        node = self.member(call)
        w, q = self.cfg.work, call.query
        if q is not None and q.version is not None:
            self.state.set_policy_version(node, q.version)

        def look() -> Want:
            return self.pacer.want(node, time.monotonic())

        def ready(want: Want) -> bool:
            # held only while the demand is what is missing: a node that must fetch a newer
            # version first is told at once
            return want.files != 0 or want.must_fetch

        wait = 0.0 if q is None else min(q.wait, w.max_hold_s)
        if wait > 0:
            with self.holds.admit(node, call.request.remote or ""):
                wanted, waiting, _ = await hold(self.state.alarm, look, ready, wait)
        else:
            wanted, waiting, _ = look()
        return WorkOrder(rules=self.published, step=self.pool.step,
                         policy_versions=self.pool.versions(),
                         shardcast_servers=w.shardcast_servers, max_file_bytes=w.max_file_bytes,
                         max_units_per_file=self.terms.max_units, files_wanted=wanted,
                         waiting=waiting)

    async def rules(self, call: Call) -> PoolRules:
        return self.published

    async def join(self, call: Call) -> JoinManifest:
        def read() -> Awaitable[ChainFacts]:
            return self.chain.run(read_chain_facts, self.chain.protocol, self.cfg.pool_id)

        try:
            return await self.join_desk.answer(read, self.terms.max_units)
        except JoinUnavailable as e:
            raise WireError(ErrorCode.CHAIN_UNAVAILABLE, str(e)) from None

    async def grant(self, call: Call) -> UploadSlot:
        node = self.member(call)
        req: SlotRequest = call.body
        w, versions, step = self.cfg.work, self.pool.versions(), self.pool.step
        if req.size > w.max_file_bytes:
            raise WireError(ErrorCode.FILE_TOO_LARGE, f"at most {w.max_file_bytes} bytes")
        if req.work_units > self.terms.max_units:
            raise WireError(ErrorCode.TOO_MANY_WORK_UNITS, f"at most {self.terms.max_units}")
        if req.policy_version not in versions:
            raise WireError(ErrorCode.STALE_WORK, f"step {step}, versions {versions}")
        bad_counter = counter_refusal(self.published, req.counter)
        if bad_counter is not None:
            raise WireError(ErrorCode.COUNTER_OUT_OF_RANGE, bad_counter)
        owes = self.pacer.owes(node)
        if owes:  # its uploads not submitted in time cost it its next slots
            raise WireError(ErrorCode.UNSUBMITTED_UPLOADS, owes)
        slot_id = secrets.token_hex(16)
        expires = time.time() + self.cfg.work.slot_ttl_s
        provider = self.state.node(node).provider  # type: ignore[union-attr]
        grant = self.state.grant_slot(slot_id, node, provider, req.sha256, req.size,
                                      req.policy_version, req.work_units, req.counter, expires)
        if grant is not Grant.GRANTED:
            raise WireError(_GRANT_REFUSALS[grant],
                            f"policy version {req.policy_version}, counter {req.counter}")
        self.pacer.granted(node, req.sha256)
        target = self.store.upload_target(slot_id, req.sha256, req.size, "")
        return UploadSlot(slot_id=slot_id, method=target.method, url=target.url,
                          signed=target.signed, expires_at=expires, sha256=req.sha256,
                          size=req.size)

    async def upload(self, call: Call) -> UploadReceipt:
        slot_id = call.param("slot_id")
        try:
            check_slot_id(slot_id)
        except StoreRefusal as e:
            raise WireError(e.code, e.detail) from None
        slot = self.state.slot(slot_id)
        if slot is None:
            raise WireError(ErrorCode.NO_SUCH_SLOT)
        if slot.node != call.address:
            raise WireError(ErrorCode.SLOT_OF_ANOTHER_NODE)
        if slot.used is SlotUse.UPLOADING:  # e.g. the connection of a killed worker
            raise WireError(ErrorCode.UPLOAD_IN_PROGRESS)
        if slot.used is not SlotUse.FREE:
            raise WireError(ErrorCode.SLOT_ALREADY_USED)
        if slot.expires_at < time.time():
            raise WireError(ErrorCode.SLOT_EXPIRED)
        if call.signer.body_sha256 != slot.sha256:  # type: ignore[union-attr]
            raise WireError(ErrorCode.SHA256_MISMATCH, "the upload is not the granted file")
        if call.request.content_length not in (None, slot.size):
            raise WireError(ErrorCode.SIZE_MISMATCH, f"granted {slot.size} bytes")
        if not self.state.claim_slot(slot_id):
            raise WireError(ErrorCode.UPLOAD_IN_PROGRESS)
        try:
            await self.store.receive(slot.sha256, slot.size, parquet_framed(
                call.request.content.iter_chunked(1 << 16), slot.size))
        except StoreRefusal as e:
            self.state.release_slot(slot_id)
            raise WireError(e.code, e.detail) from None
        except BaseException:
            self.state.release_slot(slot_id)
            raise
        self.state.finish_upload(slot_id, slot.sha256)
        self.metrics.upload_bytes.inc(slot.size)
        return UploadReceipt(sha256=slot.sha256, size=slot.size, status=FileStatus.UPLOADED)

    async def post_batch(self, call: Call) -> BatchInfo:
        """A member's batch of its uploaded files (leaf order), before it submits its root on
        chain: every leaf must be a file this node uploaded, with its grant's units, step and
        counter, each file in one batch of the node; a batch the chain announced already must
        have the count and units it was submitted with."""
        node = self.member(call)
        body: BatchPost = call.body
        leaves = body.leaves
        limit = self.published.batch.files
        if len(leaves) > limit:
            raise WireError(ErrorCode.BATCH_TOO_LARGE, f"at most {limit} files per batch")
        if len({x.sha256 for x in leaves}) != len(leaves):
            raise WireError(ErrorCode.BAD_LEAF, "a file is in a batch once")
        batch = Batch.of([Leaf(node, bytes.fromhex(x.sha256), x.work_units, x.step, x.counter)
                          for x in leaves])
        bid = batch.id.hex()
        rows = []
        for i, x in enumerate(leaves):
            row = self.state.file(x.sha256)
            if row is None or row.node.lower() != node.lower() or not row.uploaded:
                raise WireError(ErrorCode.BAD_LEAF, f"leaf {i}: not a file this node uploaded")
            # the leaf's step slot holds the file's policy version
            if (row.work_units, row.policy_version, row.counter) != (x.work_units, x.step,
                                                                     x.counter):
                raise WireError(ErrorCode.BAD_LEAF, f"leaf {i}: granted units {row.work_units},"
                                f" version {row.policy_version}, counter {row.counter}")
            if row.batch_id not in ("", bid) or (row.status not in _BEFORE_SUBMISSION
                                                  and row.batch_id != bid):
                raise WireError(ErrorCode.FILE_IN_ANOTHER_BATCH, f"leaf {i}")
            rows.append(row.seq)
        seen = self.state.batch(bid)
        if seen is not None and seen.submitted and (seen.count, seen.units) != (
                batch.count, batch.units):
            raise WireError(ErrorCode.BATCH_MISMATCH, f"submitted with {seen.count} files, "
                            f"{seen.units} units")
        encoded = json.dumps([x.model_dump() for x in leaves], separators=(",", ":"))
        self.state.post_batch(bid, node, batch.root.hex(), encoded, rows)
        if seen is not None and seen.submitted:  # the chain was first: the rows move now
            with self.state.tx():
                apply_batch(self.state, bid)
        return BatchInfo(batch_id=bid, node=node, root=batch.root.hex(), leaves=leaves,
                         submitted=bool(seen and seen.submitted))

    async def get_batch(self, call: Call) -> BatchInfo:
        await self.reader(call)
        bid = call.param("batch_id")
        if not _BATCH_ID.match(bid):
            raise WireError(ErrorCode.BAD_BATCH_ID, "64 lower hex")
        row = self.state.batch(bid)
        if row is None or not row.leaves:
            raise WireError(ErrorCode.NO_SUCH_BATCH, bid)
        leaves = [BatchLeaf(**x) for x in json.loads(row.leaves)]
        return BatchInfo(batch_id=bid, node=row.node, root=row.root, leaves=leaves,
                         submitted=row.submitted)

    async def download(self, call: Call) -> web.StreamResponse:
        await self.reader(call)
        try:
            sha = check_sha(call.param("sha256"))
        except StoreRefusal as e:
            raise WireError(e.code, e.detail) from None
        if not self.store.exists(sha):
            raise WireError(ErrorCode.NO_SUCH_FILE)
        return web.FileResponse(self.store.path(sha))

    async def verdict(self, call: Call) -> VerdictAck:
        if not await self.chain.is_validator(call.address):
            raise WireError(ErrorCode.NOT_A_VALIDATOR)
        v: Verdict = call.body
        row = self.state.file_by_work_id(v.work_id) if v.work_id else self.state.file(v.sha256)
        if row is None:  # the submission may not have reached the ledger yet: ask again
            raise WireError(ErrorCode.NO_SUCH_SUBMISSION, v.work_id or v.sha256)
        if row.sha256 != v.sha256:
            raise WireError(ErrorCode.WORK_ID_OF_ANOTHER_FILE,
                            f"work {v.work_id} is {row.sha256}")
        if row.status in _BEFORE_SUBMISSION:  # the chain's event is on its way: ask again
            raise WireError(ErrorCode.NOT_SUBMITTED_YET, f"file is {row.status.value}")
        if _late_reason(row, v, call.address):
            # the chain's event came before the verdict's text (the validator follows the
            # chain itself and may be ahead of this ledger): its reason is recorded, the status
            # (the chain's word) stays
            self.state.set_file_status(row.seq, row.status, verdict=v.verdict,
                                       reason=v.reason)
            return VerdictAck(sha256=v.sha256, status=row.status, work_id=row.work_id)
        if row.status not in (FileStatus.SUBMITTED, FileStatus.ACCEPTED):
            raise WireError(ErrorCode.NOT_AWAITING_VERDICT, f"file is {row.status.value}")
        if v.verdict is VerdictKind.ACCEPT:
            # an accept's reason says nothing ("all checks passed"): not kept
            self.state.set_file_status(row.seq, FileStatus.ACCEPTED, verdict=v.verdict,
                                       validator=call.address)
        else:  # recorded; the status moves when the chain's WorkInvalidated event is seen (a
            # row another validator accepted stays accepted: verdicts are disputed on chain,
            # and the trainer may have trained on it already)
            self.state.set_file_status(row.seq, row.status, verdict=v.verdict,
                                       reason=v.reason, validator=call.address)
        after = self.state.file_by_work_id(row.work_id) if row.work_id else \
            self.state.file(row.sha256)
        assert after is not None
        return VerdictAck(sha256=v.sha256, status=after.status, work_id=after.work_id)

    async def ledger(self, call: Call) -> LedgerPage:
        await self.reader(call)
        q: LedgerQuery = call.query

        key = (q.accepted_after, q.policy_version, q.status, q.after, q.limit, q.sha256, q.work_id)

        def look() -> list[FileRow]:
            # one SQL read per query and ledger change, whoever waits for it
            gen = self.state.files_alarm.generation
            if gen != self._ledger_gen or len(self._ledger_rows) > 256:
                self._ledger_rows, self._ledger_gen = {}, gen
            rows = self._ledger_rows.get(key)
            if rows is None:
                self.metrics.ledger_reads.inc()
                if q.accepted_after is not None:
                    rows = self.state.accepted(q.accepted_after, q.limit)
                else:
                    rows = self.state.files(q.policy_version, q.status, q.after, q.limit,
                                            q.sha256, q.work_id)
                self._ledger_rows[key] = rows
            return rows

        wait = min(q.wait, self.cfg.work.max_hold_s)
        if wait > 0:
            # woken by a ledger change only; the slow recheck is a safety net (unchanged, it
            # costs a lookup, not a query)
            with self.holds.admit(call.address, call.request.remote or ""):
                rows = await hold(self.state.files_alarm, look, bool, wait, recheck_s=1.0)
        else:
            rows = look()
        if q.accepted_after is not None:
            last = rows[-1].accepted_seq if rows else q.accepted_after
        else:
            last = rows[-1].seq if rows else q.after
        return LedgerPage(entries=[_entry(r) for r in rows], next_after=last)

    async def nodes(self, call: Call) -> PoolNodes:
        self.trainer(call)
        books = self.chain.books
        money = books.money() if books is not None else {}
        none = NodeMoney(0, 0, 0, 0, 0)
        out = []
        for n in self.state.nodes():
            m = money.get(n.address.lower(), none)
            out.append(PoolNode(
                address=n.address, provider=n.provider, state=n.state, last_seen=n.last_seen,
                policy_version=n.policy_version, step=n.step, tokens_per_s=n.tokens_per_s,
                files_pending=n.files_pending, stake=m.stake, slashed=m.slashed,
                rewards_earned=m.earned, rewards_claimed=m.claimed,
                rewards_claimable=m.claimable))
        return PoolNodes(nodes=out)

    async def step(self, call: Call) -> HeartbeatAck:
        self.trainer(call)
        new: StepUpdate = call.body
        if new.step < self.pool.step:
            raise WireError(ErrorCode.STEP_GOES_BACK, f"pool is at step {self.pool.step}")
        # refused before anything moves: a demand past the ledger would free every place
        last = self.state.last_accepted_seq()
        if new.taken_through is not None and new.taken_through > last:
            raise WireError(ErrorCode.TAKEN_BEYOND_ACCEPTED, f"taken_through "
                            f"{new.taken_through}, the last acceptance number is {last}")
        moved = new.step > self.pool.step
        self.pool.set(new.step)
        # each move restates the demand
        self.pacer.set_demand(new.taken_through, new.ahead, moved)
        return HeartbeatAck(state=NodeState.HEALTHY, interval_s=self.cfg.heartbeat.interval_s,
                            step=self.pool.step)

    def routes(self) -> list[Route]:
        small, none = 16 << 10, 0
        node, trainer, validator = ("node",), ("trainer",), ("validator",)
        E = ErrorCode
        return [
            Route("GET", "/health", self.health, response=Health, signed=False,
                  summary="liveness"),
            Route("GET", "/rules", self.rules, response=PoolRules, signed=False,
                  summary="the pool's public rules (task, sampling, group size, seed, "
                  "proof profile, ...): read before staking"),
            Route("GET", "/join", self.join, response=JoinManifest, signed=False,
                  summary="how to join from anywhere: chain, contracts and their code hashes, "
                  "rules, discovery, shardcast servers, stake and reward terms, clock; signed "
                  "by the pool manager (503 while the chain's RPC is down)",
                  refusals=(E.CHAIN_UNAVAILABLE,)),
            Route("GET", "/invite", self.invite, response=Invite, max_body=none, tags=node,
                  summary="the caller's pending invite (404 if none)", refusals=(E.NO_INVITE,)),
            Route("POST", "/heartbeat", self.heartbeat, body=Heartbeat, response=HeartbeatAck,
                  max_body=small, tags=node, summary="a node's heartbeat and state",
                  refusals=(E.NOT_IN_POOL,)),
            Route("GET", "/work", self.work, query=WorkQuery, response=WorkOrder,
                  max_body=none, tags=node, summary="the current work order; with `wait`, "
                  "held while the pool wants no file from the node (up to work.max_hold_s)",
                  refusals=(E.NOT_IN_POOL, E.TOO_MANY_HELD)),
            Route("POST", "/uploads", self.grant, body=SlotRequest, response=UploadSlot,
                  max_body=small, tags=node, summary="grant a single-use, expiring upload slot",
                  refusals=(E.NOT_IN_POOL, E.FILE_TOO_LARGE, E.TOO_MANY_WORK_UNITS,
                            E.STALE_WORK, E.COUNTER_OUT_OF_RANGE, E.UNSUBMITTED_UPLOADS,
                            E.COUNTER_USED, E.FILE_ALREADY_UPLOADED, E.FILE_ALREADY_KNOWN)),
            Route("PUT", "/uploads/{slot_id}", self.upload, response=UploadReceipt, stream=True,
                  max_body=self.cfg.work.max_file_bytes, tags=node,
                  summary="upload the slot's file (streamed; size and sha256 checked)",
                  refusals=(E.BAD_SLOT_ID, E.NO_SUCH_SLOT, E.SLOT_OF_ANOTHER_NODE,
                            E.SLOT_ALREADY_USED, E.UPLOAD_IN_PROGRESS, E.SLOT_EXPIRED,
                            E.SHA256_MISMATCH, E.SIZE_MISMATCH, E.NOT_A_ROLLOUT_FILE)),
            Route("POST", "/batches", self.post_batch, body=BatchPost, response=BatchInfo,
                  max_body=64 << 10, tags=node, summary="a member's batch of uploaded files "
                  "(leaf order), posted before its root is submitted on chain",
                  refusals=(E.NOT_IN_POOL, E.BATCH_TOO_LARGE, E.BAD_LEAF,
                            E.FILE_IN_ANOTHER_BATCH, E.BATCH_MISMATCH)),
            Route("GET", "/batches/{batch_id}", self.get_batch, response=BatchInfo,
                  max_body=none, tags=trainer + validator,
                  summary="a batch's leaves as its node posted them (check them against the "
                  "chain's root)", refusals=(E.NOT_A_READER, E.BAD_BATCH_ID, E.NO_SUCH_BATCH)),
            Route("GET", "/files/{sha256}", self.download, max_body=none,
                  tags=trainer + validator, summary="download a stored rollout file",
                  refusals=(E.NOT_A_READER, E.BAD_FILE_NAME, E.NO_SUCH_FILE)),
            Route("POST", "/verdicts", self.verdict, body=Verdict, response=VerdictAck,
                  max_body=small, tags=validator,
                  summary="a validator's verdict on a submitted file",
                  refusals=(E.NOT_A_VALIDATOR, E.NO_SUCH_SUBMISSION, E.WORK_ID_OF_ANOTHER_FILE,
                            E.NOT_SUBMITTED_YET, E.NOT_AWAITING_VERDICT)),
            Route("GET", "/ledger", self.ledger, query=LedgerQuery, response=LedgerPage,
                  max_body=none, tags=trainer + validator,
                  summary="submissions by step, status, file or work id; accepted_after: the "
                  "accepted ones in acceptance order (what the trainer may use); with `wait`, "
                  "an empty answer is held until there is an entry (up to work.max_hold_s)",
                  refusals=(E.NOT_A_READER, E.TOO_MANY_HELD)),
            Route("GET", "/nodes", self.nodes, response=PoolNodes, max_body=none, tags=trainer,
                  summary="the pool's nodes and their last heartbeats",
                  refusals=(E.NOT_A_READER,)),
            Route("POST", "/step", self.step, body=StepUpdate, response=HeartbeatAck,
                  max_body=small, tags=trainer, summary="the trainer moves the pool to a step",
                  refusals=(E.NOT_A_READER, E.STEP_GOES_BACK, E.TAKEN_BEYOND_ACCEPTED)),
        ]


_INVALIDATED = {FileStatus.HARD_INVALIDATED: VerdictKind.HARD_INVALID,
                FileStatus.SOFT_INVALIDATED: VerdictKind.SOFT_INVALID}


def _late_reason(row: FileRow, v: Verdict, validator: str) -> bool:
    """A verdict's text that may still be recorded on a row the chain already invalidated: the
    row has none yet, it comes from the validator the chain names, and it says what the chain
    did. Anything else about an invalidated row is refused (`NOT_AWAITING_VERDICT`)."""
    return (row.verdict is None and _INVALIDATED.get(row.status) is v.verdict
            and bool(row.validator) and row.validator.lower() == validator.lower())


def _entry(r: FileRow) -> LedgerEntry:
    return LedgerEntry(
        seq=r.seq, sha256=r.sha256, node=r.node, provider=r.provider,
        policy_version=r.policy_version, work_units=r.work_units, size=r.size, status=r.status,
        verdict=r.verdict, verdict_reason=r.verdict_reason,
        download=f"/files/{r.sha256}" if r.uploaded else "", work_id=r.work_id, granted=r.granted,
        uploaded=r.uploaded, accepted_seq=r.accepted_seq, counter=r.counter, batch_id=r.batch_id)
