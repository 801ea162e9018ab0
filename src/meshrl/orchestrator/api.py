"""The orchestrator's HTTP API: one handler per route, each a thin layer over `State`, the file
store and the chain view. Who may call what:

| route | caller |
| --- | --- |
| `GET /health`, `GET /rules` | anyone (unsigned) |
| `GET /invite` | a candidate node |
| `POST /heartbeat`, `GET /work`, `POST /uploads`, `PUT /uploads/{slot}` | a pool member |
| `POST /verdicts` | an address with the validator role on chain |
| `GET /ledger`, `GET /files/{sha256}` | readers (the trainer), validators, the manager |
| `GET /nodes`, `POST /step` | readers (the trainer) and the manager |
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from aiohttp import web

from meshrl.orchestrator.books import NodeMoney
from meshrl.orchestrator.state import FileRow
from meshrl.orchestrator.store import StoreRefusal, check_sha, check_slot_id
from meshrl.pool import PoolRules, WorkOrder
from meshrl.wire.errors import WireError
from meshrl.wire.models import (
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

if TYPE_CHECKING:
    from meshrl.orchestrator.service import Orchestrator

__all__ = ["OrchestratorApi"]

LIVE = (NodeState.HEALTHY, NodeState.UNHEALTHY)


class OrchestratorApi:
    """The handlers, bound to one orchestrator; `routes()` declares them for `build_app`."""

    def __init__(self, o: Orchestrator) -> None:
        self.o, self.cfg = o, o.cfg

    def member(self, call: Call) -> str:
        node = self.o.state.node(call.address)
        if node is None or node.state not in LIVE:
            raise WireError(403, "not in pool", "join the pool with an invite first")
        return node.address

    async def reader(self, call: Call) -> str:
        addr = call.address
        if addr in self.o.readers or addr.lower() == self.o.manager.lower():
            return addr
        if await self.o.chain.is_validator(addr):
            return addr
        raise WireError(403, "not a reader")

    def trainer(self, call: Call) -> str:
        if call.address in self.o.readers or call.address.lower() == self.o.manager.lower():
            return call.address
        raise WireError(403, "not a reader")

    async def health(self, call: Call) -> Health:
        return Health(service="orchestrator", info=self.o.health_info())

    async def invite(self, call: Call) -> Invite:
        row = self.o.state.invite(call.address)
        if row is None or row[2] < time.time():
            raise WireError(404, "no invite")
        _, nonce, expiry, sig = row
        return Invite(pool_id=self.cfg.pool_id, domain_id=self.o.domain, node=call.address,
                      nonce=nonce, expiry=expiry, signature=sig)

    async def heartbeat(self, call: Call) -> HeartbeatAck:
        node = self.member(call)
        hb: Heartbeat = call.body
        self.o.state.heartbeat(node, time.time(), hb.policy_version, hb.step, hb.tokens_per_s,
                          hb.files_pending)
        self.o.metrics.heartbeats.inc()
        return HeartbeatAck(state=NodeState.HEALTHY, interval_s=self.cfg.heartbeat.interval_s,
                            step=self.o.step)

    async def work(self, call: Call) -> WorkOrder:
        self.member(call)
        w = self.cfg.work
        return WorkOrder(rules=self.o.rules, step=self.o.step,
                         policy_versions=self.o.policy_versions(),
                         shardcast_servers=w.shardcast_servers, max_file_bytes=w.max_file_bytes,
                         max_units_per_file=self.o.max_units)

    async def rules(self, call: Call) -> PoolRules:
        return self.o.rules

    async def grant(self, call: Call) -> UploadSlot:
        node = self.member(call)
        req: SlotRequest = call.body
        w, versions = self.cfg.work, self.o.policy_versions()
        if req.size > w.max_file_bytes:
            raise WireError(413, "file too large", f"at most {w.max_file_bytes} bytes")
        if req.work_units > self.o.max_units:
            raise WireError(422, "too many work units", f"at most {self.o.max_units}")
        if req.step > self.o.step or req.policy_version not in versions:
            raise WireError(409, "stale work", f"step {self.o.step}, versions {versions}")
        slot_id = secrets.token_hex(16)
        expires = time.time() + self.cfg.work.slot_ttl_s
        provider = self.o.state.node(node).provider  # type: ignore[union-attr]
        if not self.o.state.grant_slot(slot_id, node, provider, req.sha256, req.size, req.step,
                                  req.policy_version, req.work_units, expires):
            raise WireError(409, "file already known")
        target = self.o.store.upload_target(slot_id, req.sha256, req.size, "")
        return UploadSlot(slot_id=slot_id, method=target.method, url=target.url,
                          signed=target.signed, expires_at=expires, sha256=req.sha256,
                          size=req.size)

    async def upload(self, call: Call) -> UploadReceipt:
        slot_id = call.param("slot_id")
        try:
            check_slot_id(slot_id)
        except StoreRefusal as e:
            raise WireError(400, e.reason) from None
        slot = self.o.state.slot(slot_id)
        if slot is None:
            raise WireError(404, "no such slot")
        if slot.node != call.address:
            raise WireError(403, "slot of another node")
        if slot.used:
            raise WireError(409, "slot already used")
        if slot.expires_at < time.time():
            raise WireError(410, "slot expired")
        if call.signer.body_sha256 != slot.sha256:  # type: ignore[union-attr]
            raise WireError(400, "sha256 mismatch", "the upload is not the granted file")
        if call.request.content_length not in (None, slot.size):
            raise WireError(400, "size mismatch", f"granted {slot.size} bytes")
        if not self.o.state.claim_slot(slot_id):
            raise WireError(409, "slot already used")
        try:
            await self.o.store.receive(slot.sha256, slot.size,
                                  call.request.content.iter_chunked(1 << 16))
        except StoreRefusal as e:
            self.o.state.release_slot(slot_id)
            raise WireError(400, e.reason, e.detail) from None
        except BaseException:
            self.o.state.release_slot(slot_id)
            raise
        self.o.state.finish_upload(slot_id, slot.sha256)
        self.o.metrics.upload_bytes.inc(slot.size)
        return UploadReceipt(sha256=slot.sha256, size=slot.size, status=FileStatus.UPLOADED)

    async def download(self, call: Call) -> web.StreamResponse:
        await self.reader(call)
        try:
            sha = check_sha(call.param("sha256"))
        except StoreRefusal as e:
            raise WireError(400, e.reason, e.detail) from None
        if not self.o.store.exists(sha):
            raise WireError(404, "no such file")
        return web.FileResponse(self.o.store.path(sha))

    async def verdict(self, call: Call) -> VerdictAck:
        if not await self.o.chain.is_validator(call.address):
            raise WireError(403, "not a validator")
        v: Verdict = call.body
        row = self.o.state.file_by_work_id(v.work_id) if v.work_id else self.o.state.file(v.sha256)
        if row is None:  # the submission may not have reached the ledger yet: ask again
            raise WireError(404, "no such submission" if v.work_id else "no such file")
        if row.sha256 != v.sha256:
            raise WireError(422, "work id of another file", f"work {v.work_id} is {row.sha256}")
        if row.status not in (FileStatus.SUBMITTED, FileStatus.ACCEPTED):
            raise WireError(409, "not awaiting a verdict", f"file is {row.status.value}")
        if v.verdict is VerdictKind.ACCEPT:
            self.o.state.set_file_status(row.seq, FileStatus.ACCEPTED, verdict=v.verdict.value,
                                         validator=call.address)
        else:  # recorded; the status moves when the chain's WorkInvalidated event is seen
            self.o.state.set_file_status(row.seq, FileStatus.SUBMITTED,
                                         verdict=f"{v.verdict.value}: {v.reason}",
                                         validator=call.address)
        after = self.o.state.file_by_work_id(row.work_id) if row.work_id else \
            self.o.state.file(row.sha256)
        assert after is not None
        return VerdictAck(sha256=v.sha256, status=after.status, work_id=after.work_id)

    async def ledger(self, call: Call) -> LedgerPage:
        await self.reader(call)
        q: LedgerQuery = call.query
        if q.accepted_after is not None:
            rows = self.o.state.accepted(q.accepted_after, q.limit)
            last = rows[-1].accepted_seq if rows else q.accepted_after
        else:
            rows = self.o.state.files(q.step, q.status, q.after, q.limit, q.sha256, q.work_id)
            last = rows[-1].seq if rows else q.after
        return LedgerPage(entries=[_entry(r) for r in rows], next_after=last)

    async def nodes(self, call: Call) -> PoolNodes:
        self.trainer(call)
        books = self.o.chain.books
        money = books.money() if books is not None else {}
        none = NodeMoney(0, 0, 0, 0, 0)
        out = []
        for n in self.o.state.nodes():
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
        if new.step < self.o.step:
            raise WireError(409, "step goes back", f"pool is at step {self.o.step}")
        self.o.set_step(new.step)
        return HeartbeatAck(state=NodeState.HEALTHY, interval_s=self.cfg.heartbeat.interval_s,
                            step=self.o.step)

    def routes(self) -> list[Route]:
        small, none = 16 << 10, 0
        node, trainer, validator = ("node",), ("trainer",), ("validator",)
        return [
            Route("GET", "/health", self.health, response=Health, signed=False,
                  summary="liveness"),
            Route("GET", "/rules", self.rules, response=PoolRules, signed=False,
                  summary="the pool's public rules (task, sampling, group size, seed, "
                  "proof profile, ...): read before staking"),
            Route("GET", "/invite", self.invite, response=Invite, max_body=none, tags=node,
                  summary="the caller's pending invite (404 if none)"),
            Route("POST", "/heartbeat", self.heartbeat, body=Heartbeat, response=HeartbeatAck,
                  max_body=small, tags=node, summary="a node's heartbeat and state"),
            Route("GET", "/work", self.work, response=WorkOrder, max_body=none, tags=node,
                  summary="the current work order"),
            Route("POST", "/uploads", self.grant, body=SlotRequest, response=UploadSlot,
                  max_body=small, tags=node, summary="grant a single-use, expiring upload slot"),
            Route("PUT", "/uploads/{slot_id}", self.upload, response=UploadReceipt, stream=True,
                  max_body=self.cfg.work.max_file_bytes, tags=node,
                  summary="upload the slot's file (streamed; size and sha256 checked)"),
            Route("GET", "/files/{sha256}", self.download, max_body=none,
                  tags=trainer + validator, summary="download a stored rollout file"),
            Route("POST", "/verdicts", self.verdict, body=Verdict, response=VerdictAck,
                  max_body=small, tags=validator,
                  summary="a validator's verdict on a submitted file"),
            Route("GET", "/ledger", self.ledger, query=LedgerQuery, response=LedgerPage,
                  max_body=none, tags=trainer + validator,
                  summary="submissions by step, status, file or work id; accepted_after: the "
                  "accepted ones in acceptance order (what the trainer may use)"),
            Route("GET", "/nodes", self.nodes, response=PoolNodes, max_body=none, tags=trainer,
                  summary="the pool's nodes and their last heartbeats"),
            Route("POST", "/step", self.step, body=StepUpdate, response=HeartbeatAck,
                  max_body=small, tags=trainer, summary="the trainer moves the pool to a step"),
        ]


def _entry(r: FileRow) -> LedgerEntry:
    return LedgerEntry(
        seq=r.seq, sha256=r.sha256, node=r.node, provider=r.provider, step=r.step,
        policy_version=r.policy_version, work_units=r.work_units, size=r.size, status=r.status,
        verdict=r.verdict, download=f"/files/{r.sha256}" if r.uploaded else "",
        work_id=r.work_id, granted=r.granted, uploaded=r.uploaded, accepted_seq=r.accepted_seq)
