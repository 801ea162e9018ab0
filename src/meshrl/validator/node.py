# over 400 lines: the validator's loop from chain event to verdict on chain, its batches' leaves and
#  their copies included, so a submission's whole path is read in one place
"""The validator process: follow `WorkSubmitted` (and `BatchSubmitted`), judge each file, act
on the verdict.

At start the pool's published rules are read (`GET /rules`): they are the only rules this
validator judges by. A validator whose `[rules]` pins any rule to another value refuses to run
(one line naming the field, `EXIT_REFUSED`), and so does one that sees the published rules change
while it runs (re-read every `rules_check_s`): an operator's typo never slashes an honest worker.
Each loop: poll the chain from the persisted cursor and queue the pool's new submissions of
this validator's share (`share`: work id mod `of`; validators of a pool split the files) and
the `share.audit` fraction of the others';
take the due jobs, download and parse their files, group them by policy version and verify each
group with shared prefill batches; then act: a hard verdict calls `hard_invalidate` (slash,
eject), a soft one `soft_invalidate`, an accepted file is reported to the orchestrator; every
verdict goes to the orchestrator's ledger with its reason. Verdicts are answerable
(`disputes.py`): the validator keeps a bond posted for `bond_verdicts` open verdicts, votes on
another validator's open verdict by its own judgment of the file (uphold or overturn), also when
the accusation comes after its own judgment or the file is outside its share (then judged
next, ahead of its queue), and settles the verdicts it made or voted on once
their dispute period is over. A batch of its share (issue 46) is read from the orchestrator
(`GET /batches/{id}`: the leaves its node posted), checked against the root and count on chain,
and becomes one job per file, judged as any file (the rows replayed drawn from the hash of the
block holding the batch and the file's sha256); a file found invalid is taken out of its batch
and accused in one transaction (`open_leaf` with its proof), an accepted one costs nothing on
chain. A leaf whose file already has a work item (submitted twice) is opened with a hard
verdict, which voids it and accuses its batch. The chain cannot see a copy the other way round
(the file submitted on its own, or in another batch, after its batch): the leaves of every batch
expanded here are remembered until the batch's window closes (`ValidatorState.leaves`), and a
`WorkSubmitted` of one of them (whoever's share it is in), or the same file in a later batch,
opens the remembered leaf as that copy at once (`_copy_of_leaf`). After that window (the chain
refuses `open_leaf`) the leaves are still remembered (`LeafMemory`, bounded, oldest evicted),
and the later submission is the copy: hard-invalidated while its own window is open
(`_duplicate`), the file paid once, in its batch. A batch whose leaves the
orchestrator never serves (its node never posted them, or they are not files it uploaded; the
orchestrator refuses a file in a second batch, or one submitted on its own already) ends, after
the retries, soft-invalidated as a whole. Failures of the validator itself
(download, missing policy version, an exception in its own code) retry the job with backoff and
end, at worst, in a soft invalidation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections.abc import Callable
from typing import Any

from eth_account.signers.local import LocalAccount

from meshrl.log import get_logger, log_event
from meshrl.pool import (
    Decision,
    PoolRules,
    PoolRulesError,
    check_rules,
    give_up,
    read_rules,
    require_same_rules,
    unmet_profile,
)
from meshrl.protocol import ChainError, Deployment, Event, Protocol, Standing, WorkStatus
from meshrl.protocol.batches import MAX_BATCH, Batch, Leaf
from meshrl.protocol.history import leaf_submission, submission
from meshrl.protocol.local import connect
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.disputes import Clerk, LeafRef
from meshrl.validator.judge import Judge, Unjudged
from meshrl.validator.policy import backoff_delay
from meshrl.validator.state import Job, LeafMemory, ValidatorState
from meshrl.wire import (
    NoSuchSubmission,
    NotAwaitingVerdict,
    NotSubmittedYet,
    SignedClient,
    WireHTTPError,
)
from meshrl.wire.models import MAX_REASON, BatchInfo, LedgerPage, Verdict, VerdictKind
from meshrl.wire.signing import orchestrator_audience

__all__ = ["ValidatorNode"]

log = get_logger("meshrl.validator")
_HEX32 = re.compile(r"[0-9a-f]{64}")


class ValidatorNode:
    def __init__(self, cfg: ValidatorConfig, account: LocalAccount,
                 amend: Callable[[bytes, Decision], Decision] | None = None) -> None:
        """`amend`: a hook on each verdict before it is acted on (the work id, the verdict),
        for the rogue validator of tests and demos (`meshrl.adversaries`); None when honest."""
        self.cfg, self.account, self.amend = cfg, account, amend
        self.stop = asyncio.Event()
        self.judged = 0
        # work queued from its `WorkSubmitted` event by this process and seen accused by no
        # one since: an accepting verdict on it has nothing to do on chain, so the chain is not
        # asked (a view call per accepted file). An accusation arriving later is voted on when
        # its event is seen (`_accused`); after a restart every job is asked about as before.
        self.unaccused: set[str] = set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        dep = Deployment.load(self.cfg.chain.deployment)
        self.chain = Protocol(connect(self.cfg.chain), dep, self.account)
        if not await asyncio.to_thread(self.chain.is_validator, self.account.address):
            log_event(log, "this key has no validator role: invalidations will revert",
                      address=self.account.address)
        self.clerk = Clerk(self.chain)
        try:
            await asyncio.to_thread(self.clerk.ensure_bond, self.cfg.bond_verdicts)
        except ChainError as e:  # no tokens, say: its verdicts will be refused, and logged
            log_event(log, "bond not posted", error=str(e))
        self.state = ValidatorState.load(f"{self.cfg.work_dir}/state.json", dep.block)
        self.memory = LeafMemory(f"{self.cfg.work_dir}/leaf_memory.jsonl", self.cfg.leaf_memory)
        self.cursor = self.chain.events(self.state.next_block)
        audience = orchestrator_audience(dep.chain_id, self.cfg.pool_id)  # never learnt from it
        async with SignedClient(self.cfg.orchestrator_url, self.account.key,
                                audience=audience) as orch:
            self.orch = orch
            rules = await self._rules(orch)
            if rules is None:
                return 0  # stopped before the orchestrator answered
            self.judge = Judge(self.cfg, rules, orch)
            while not self.stop.is_set() and not self._enough():
                await self._recheck_rules(orch)
                await self._poll()
                await self._post_verdicts(orch)
                await asyncio.to_thread(self.clerk.settle_due)
                due = [j for j in self.state.queue if j.not_before <= time.time()]
                if due:
                    await self._judge(due[: self.cfg.batch_files])
                else:
                    await self._sleep(self.cfg.poll_interval)
            await self._post_verdicts(orch)
        log_event(log, "stopped", judged=self.judged)
        return 0

    async def _rules(self, orch: SignedClient) -> PoolRules | None:
        """The published rules, refused (`PoolRulesError`) when this validator's config pins
        another value of any of them (workers stake on the published ones), or when its
        compute dtype cannot honour their proof profile."""
        rules = await read_rules(orch, self.stop, self.cfg.poll_interval)
        if rules is None:
            return None
        check_rules(rules, self.cfg.pool_id, self.cfg.rules, "validator")
        # recomputing in a dtype the published profile does not hold for would slash honest
        # work (issue #41): refused for good, as a worker is (`worker/profile.py`)
        why = unmet_profile(rules.proof_profile, self.cfg.dtype, self.cfg.backend, "validator")
        if why is not None:
            raise PoolRulesError(why)
        log_event(log, "pool rules", pool=rules.pool_id, proof_profile=rules.proof_profile,
                  thresholds_overridden="thresholds" in self.cfg.replay)
        self.rules, self.rules_read = rules, time.monotonic()
        return rules

    async def _recheck_rules(self, orch: SignedClient) -> None:
        """Stop (`PoolRulesError`) if the published rules changed since the start: every file
        judged from here on would be judged by rules its worker may not have generated by."""
        if time.monotonic() - self.rules_read < self.cfg.rules_check_s:
            return
        now = await read_rules(orch, self.stop, self.cfg.poll_interval)
        self.rules_read = time.monotonic()
        if now is not None:
            require_same_rules(self.rules, now)

    def _enough(self) -> bool:
        return self.cfg.max_files > 0 and self.judged >= self.cfg.max_files

    async def _poll(self) -> None:
        events = await asyncio.to_thread(self.cursor.poll)
        mine, accused, copies = [], set(), []
        for e in events:
            if e.name == "WorkSubmitted" and int(e.args["pool"]) == self.cfg.pool_id and (
                    bytes(e.args["work_id"]).hex() in self.state.leaves or
                    bytes(e.args["work_id"]).hex() in self.memory):
                copies.append(e)  # a leaf of a batch, again
            if e.name == "WorkAccused":
                wid = bytes(e.args["work_id"]).hex()
                accused.add(wid)
                self.unaccused.discard(wid)
                if e.args["validator"].lower() != self.clerk.me:
                    await self._accused(bytes(e.args["work_id"]))
            if e.name not in ("WorkSubmitted", "BatchSubmitted") or \
                    int(e.args["pool"]) != self.cfg.pool_id:
                continue
            key = e.args["work_id" if e.name == "WorkSubmitted" else "batch_id"]
            if self.cfg.share.judges(bytes(key), self.clerk.me):
                mine.append(e)  # else another validator's share (judged here if accused)
        jobs = await asyncio.to_thread(self._jobs, mine) if mine else []
        self.unaccused.update(j.work_id for j in jobs if j.work_id not in accused)
        if jobs or events:
            self.state.enqueue(jobs, self.cursor.next_block)
        elif self.cursor.next_block != self.state.next_block:
            self.state.enqueue([], self.cursor.next_block)
        if jobs:
            log_event(log, "submissions queued", files=len(jobs), queue=len(self.state.queue))
        for e in copies:
            await self._submitted_again(e)
        self.state.forget_leaves([], time.time())

    async def _submitted_again(self, e: Event) -> None:
        """A file remembered as a leaf of a batch expanded here has a `WorkSubmitted` of its
        own now. The batch's window open: its leaf is opened as the copy (`_copy_of_leaf`).
        Closed (the chain refuses `open_leaf` then): the later submission is the copy, and is
        hard-invalidated as a duplicate (`_duplicate`) while its own window is open, so the
        file is paid once, in its batch."""
        wid = bytes(e.args["work_id"]).hex()
        seen = self.memory.get(wid) or self.state.leaves.get(wid)
        if seen is None or int(seen.get("block", 0)) > e.block:
            return  # submitted before its batch: the batch's expansion voids the leaf
        now = await asyncio.to_thread(self.chain.backend.now)
        if wid in self.state.leaves and now < int(self.state.leaves[wid]["until"]):
            await self._copy_of_leaf(wid, "submitted on its own")
            return
        self.state.forget_leaves([wid], time.time())
        jobs = await asyncio.to_thread(self._jobs, [e])
        await self._duplicate(jobs[0], seen)

    def _paid_leaf(self, seen: dict[str, Any]) -> str | None:
        """Why the remembered leaf `seen` pays its file (blocking), or None when its batch does
        not (invalidated whole, or wiped): then a later submission of the file is no copy."""
        bid = bytes.fromhex(seen["batch_id"])
        info = self.chain.work(bid)
        if info.status in (WorkStatus.NONE, WorkStatus.SOFT_INVALIDATED,
                           WorkStatus.HARD_INVALIDATED) or \
                self.chain.standing(bid) == Standing.WIPED:
            return None
        return f"duplicate: the file is leaf {seen['index']} of batch 0x{seen['batch_id']}"

    async def _duplicate(self, job: Job, seen: dict[str, Any]) -> bool:
        """Hard-invalidate `job`, a later submission (on its own, or a leaf of a later batch)
        of a file that an earlier batch of its node pays, its window closed; True when done."""
        if self.state.judged.get(job.work_id) == VerdictKind.HARD_INVALID.value:
            return True  # acted on already (its accusation and its submission, one poll)
        why = await asyncio.to_thread(self._paid_leaf, seen)
        if why is None:
            return False
        # on chain only: the ledger's row under this work id is the earlier leaf's (accepted)
        tx = await asyncio.to_thread(self.clerk.act, bytes.fromhex(job.work_id),
                                     VerdictKind.HARD_INVALID, self._leaf(job))
        self.unaccused.discard(job.work_id)
        self.state.record(job, VerdictKind.HARD_INVALID.value)
        log_event(log, "duplicate of a leaf", work_id=job.work_id, batch_id=seen["batch_id"],
                  index=seen["index"], later_batch=job.batch_id, reason=why, tx=tx)
        return True

    async def _copy_of_leaf(self, wid: str, why: str) -> str:
        """A remembered leaf whose file has an item of its own now (submitted on its own, or
        opened out of another batch): open it as the copy it is, with a hard verdict, so its
        units leave its batch and the batch is accused (the file is paid at most once)."""
        entry = self.state.leaves[wid]
        ref = self._leaf(Job(**{k: v for k, v in entry.items() if k != "until"}))
        assert ref is not None
        tx = await asyncio.to_thread(self.clerk.act, bytes.fromhex(wid),
                                     VerdictKind.HARD_INVALID, ref, True)
        log_event(log, "copy of a leaf", work_id=wid, batch_id=entry["batch_id"],
                  index=entry["index"], copy=why, tx=tx)
        self.state.forget_leaves([wid], time.time())
        return tx

    def _jobs(self, events: list[Event]) -> list[Job]:
        """The jobs of judging the submissions of `WorkSubmitted` events (blocking): their
        work items read in batches, not one call each."""
        ids = [bytes(e.args["work_id" if e.name == "WorkSubmitted" else "batch_id"])
               for e in events]
        infos = self.chain.works(ids)
        # the submission's block hash picks the rows replayed on the model (pool/sampled.py);
        # the log names it, else it is read from the block
        out = []
        for e, wid, info in zip(events, ids, infos, strict=True):
            block_hash = e.block_hash or self.chain.backend.block_hash(e.block)
            if e.name == "BatchSubmitted":  # its leaves are read next (`_expand`)
                out.append(Job(wid.hex(), "", e.args["node"], info.provider, self.cfg.pool_id,
                               int(e.args["units"]), e.block, block_hash, batch_id=wid.hex(),
                               root=bytes(e.args["root"]).hex(), count=int(e.args["count"])))
            else:
                out.append(Job(wid.hex(), bytes(e.args["file_sha256"]).hex(), e.args["node"],
                               info.provider, self.cfg.pool_id, int(e.args["units"]), e.block,
                               block_hash))
        return out

    async def _expand(self, job: Job) -> None:
        """A batch's job: its leaves from the orchestrator, checked against the chain's root,
        count and units, become jobs of their own (copies of files that have a work item
        already are opened at once with a hard verdict, never judged again)."""
        try:
            info = await self.orch.call("GET", f"/batches/{job.batch_id}", response=BatchInfo)
        except (WireHTTPError, OSError) as e:
            await self._retry(job, f"batch leaves: {e}")
            return
        leaves = info.leaves
        if not 1 <= len(leaves) <= MAX_BATCH or len(leaves) != job.count:
            await self._retry(job, f"batch leaves: {len(leaves)}, the chain says {job.count}")
            return
        try:
            batch = Batch.of([Leaf(job.node, bytes.fromhex(x.sha256), x.work_units, x.step,
                                   x.counter) for x in leaves])
        except ValueError as e:
            await self._retry(job, f"batch leaves: {e}")
            return
        if batch.root.hex() != job.root or batch.units != job.units:
            await self._retry(job, "batch leaves do not hash to the root on chain")
            return
        ids = [x.work_id for x in batch.leaves]
        *have, info = await asyncio.to_thread(self.chain.works, [*ids, bytes.fromhex(
            job.batch_id)])
        jobs, now = [], await asyncio.to_thread(self.chain.backend.now)
        for i, (leaf, wid, w) in enumerate(zip(batch.leaves, ids, have, strict=True)):
            ref = LeafRef(batch.root, i, leaf, batch.proof(i))
            mine = Job(wid.hex(), leaf.file_sha256.hex(), job.node, job.provider, job.pool,
                       leaf.units, job.block, job.block_hash, batch_id=job.batch_id,
                       root=job.root, index=i, step=leaf.step, counter=leaf.counter,
                       count=batch.count, proof=[p.hex() for p in ref.proof])
            other = self.state.leaves.get(wid.hex())
            seen = self.memory.get(wid.hex())
            if w.status == WorkStatus.NONE and seen is not None and \
                    seen["batch_id"] != job.batch_id and \
                    (other is None or now >= int(other["until"])):
                # the same file in an earlier batch whose window closed: this leaf is the copy
                self.state.forget_leaves([wid.hex()], time.time())
                if await self._duplicate(mine, seen):
                    continue
            other = self.state.leaves.get(wid.hex())
            if w.status == WorkStatus.NONE and other is not None and \
                    other["batch_id"] != job.batch_id:
                # the same file in an earlier batch expanded here: the chain sees the copy
                # only once the earlier leaf is a work item (opened plain, it stays judged)
                first = self._leaf(Job(**{k: v for k, v in other.items() if k != "until"}))
                assert first is not None
                try:
                    await asyncio.to_thread(self.chain.open_leaf, first.root, first.index,
                                            first.leaf, first.proof)
                    w = await asyncio.to_thread(self.chain.work, wid)
                except ChainError as e:  # its window closed, say: judged as any file here
                    log_event(log, "earlier leaf not opened", work_id=wid.hex(), error=str(e))
                self.state.forget_leaves([wid.hex()], time.time())
            if w.status != WorkStatus.NONE:  # the file has an item already: a copy
                tx = await asyncio.to_thread(self.clerk.act, wid, VerdictKind.HARD_INVALID,
                                             ref, True)
                log_event(log, "copy in a batch", batch_id=job.batch_id, index=i,
                          work_id=wid.hex(), tx=tx)
                continue
            jobs.append(mine)
        self.state.expand(job, jobs, info.judge_until)
        self.memory.add({j.work_id: {"batch_id": job.batch_id, "index": j.index,
                                     "block": job.block, "until": info.judge_until}
                         for j in jobs})
        self.unaccused.update(j.work_id for j in jobs)
        log_event(log, "batch queued", batch_id=job.batch_id, files=len(jobs),
                  queue=len(self.state.queue))

    @staticmethod
    def _leaf(job: Job) -> LeafRef | None:
        if not job.batch_id or job.index < 0:
            return None
        return LeafRef(bytes.fromhex(job.root), job.index,
                       Leaf(job.node, bytes.fromhex(job.sha256), job.units, job.step,
                            job.counter), [bytes.fromhex(p) for p in job.proof])

    async def _judge(self, jobs: list[Job]) -> None:
        batches = [j for j in jobs if j.batch_id and not j.sha256]
        for batch in batches:
            await self._expand(batch)
        jobs = [j for j in jobs if j.sha256]
        if batches:  # the leaves head the queue now: judged in this turn, not after a poll
            now, have = time.time(), {j.work_id for j in jobs}
            jobs += [j for j in self.state.queue if j.sha256 and j.not_before <= now and
                     j.work_id not in have][: max(0, self.cfg.batch_files - len(jobs))]
        if not jobs:
            return
        # judging (downloads, replays) ends with a stop: the jobs stay queued for the next
        # start; acting on verdicts below is never cut in the middle
        judging = asyncio.ensure_future(self.judge.judge(jobs))
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({judging, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not judging.done():
            judging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await judging
            return
        outcomes = judging.result()
        for job, out in zip(jobs, outcomes, strict=True):
            if isinstance(out, Unjudged):
                await self._retry(job, out.error)
            else:
                if self.amend is not None:
                    out = self.amend(bytes.fromhex(job.work_id), out)
                await self._act(job, out)

    async def _retry(self, job: Job, error: str) -> None:
        job.attempts += 1
        job.last_error = error
        if job.attempts >= self.cfg.retry.max_attempts:
            await self._act(job, give_up(error, job.attempts))
            return
        job.not_before = time.time() + backoff_delay(job.attempts, self.cfg.retry)
        self.state.save()
        log_event(log, "retry later", sha256=job.sha256, attempt=job.attempts, error=error)

    async def _act(self, job: Job, d: Decision) -> None:
        """Post the verdict (reason and numbers) first, so the ledger row carries it when the
        chain's invalidation event reaches the orchestrator; then invalidate on chain."""
        # addressed by work id: every submission has its own ledger row (a copy's included);
        # a batch whose leaves never came has none (its verdict is the chain's only)
        verdict: Verdict | None = None
        if job.sha256:
            verdict = Verdict(sha256=job.sha256, work_id=job.work_id, verdict=d.kind,
                              reason=d.reason[:MAX_REASON])
        if verdict is not None and await self._post(verdict):
            verdict = None
        tx = ""
        if d.kind is not VerdictKind.ACCEPT or job.work_id not in self.unaccused:
            tx = await asyncio.to_thread(self.clerk.act, bytes.fromhex(job.work_id), d.kind,
                                         self._leaf(job))
        self.unaccused.discard(job.work_id)
        self.state.record(job, d.kind.value, verdict)  # a verdict not posted is kept for later
        self.judged += 1
        log_event(log, "verdict", sha256=job.sha256, node=job.node, verdict=d.kind.value,
                  reason=d.reason, checks=[c.value for c in d.checks], tx=tx, stats=d.stats)

    async def _accused(self, wid: bytes) -> None:
        """Another validator accused work: vote by this validator's own judgment. Judged
        already: at once. Queued: judged next. Another validator's share (never queued
        here): its submission is read from the chain and judged next, ahead of the queue, so
        the vote comes within the dispute period. A file submitted on its own that an earlier
        batch of its node holds is the duplicate, whatever its content: upheld
        (`_duplicate_accused`), never voted by the leaf's own verdict (same work id)."""
        if await self._duplicate_accused(wid):
            return
        kind = self.state.judged.get(wid.hex())
        if kind is not None:
            await asyncio.to_thread(self.clerk.act, wid, VerdictKind(kind))
            return
        if not any(j.work_id == wid.hex() for j in self.state.queue):
            sub = await asyncio.to_thread(submission, self.chain, wid)
            if sub is None:  # a file opened out of its batch?
                jobs = await asyncio.to_thread(self._leaf_jobs, wid)
            elif int(sub.args["pool"]) == self.cfg.pool_id:
                jobs = await asyncio.to_thread(self._jobs, [sub])
            else:
                jobs = []
            if not jobs:
                return
            self.state.enqueue(jobs, self.state.next_block)
        self.state.first(wid.hex())
        log_event(log, "re-judging an accused file", work_id=wid.hex())

    async def _duplicate_accused(self, wid: bytes) -> bool:
        """An accused submission of a file this validator remembers as a leaf of an earlier
        batch of its node, or that the orchestrator's ledger places in one (checked against
        the chain, `_ledger_leaf`: a co-validator of another share never expanded it): voted
        on as a duplicate (`_duplicate`); True when it was."""
        if self.rules.batch.files <= 1:
            return False  # a pool without batches
        sub = await asyncio.to_thread(submission, self.chain, wid)
        if sub is None or int(sub.args["pool"]) != self.cfg.pool_id:
            return False  # a file opened out of its batch, or another pool's
        seen = self.memory.get(wid.hex())
        if seen is None or int(seen.get("block", 0)) > sub.block:
            seen = await self._ledger_leaf(sub)
        if seen is None:
            return False
        jobs = await asyncio.to_thread(self._jobs, [sub])
        return await self._duplicate(jobs[0], seen)

    async def _ledger_leaf(self, sub: Event) -> dict[str, Any] | None:
        """The earlier batch leaf of the file of `sub` (a `WorkSubmitted`) as the orchestrator's
        ledger names it, believed only when checked: the batch's leaves hash to that batch
        id with the same node (so to its root on chain), hold the file, and the chain's batch
        item was submitted before the file's (a second earlier: the same second is not
        enough to tell which came first)."""
        wid, sha = bytes(sub.args["work_id"]).hex(), bytes(sub.args["file_sha256"])
        try:
            page = await self.orch.call("GET", "/ledger", response=LedgerPage,
                                        query={"work_id": wid, "limit": 8})
        except (WireHTTPError, OSError):
            return None
        for bid in {e.batch_id for e in page.entries if _HEX32.fullmatch(e.batch_id)}:
            try:
                info = await self.orch.call("GET", f"/batches/{bid}", response=BatchInfo)
                if not 1 <= len(info.leaves) <= MAX_BATCH:
                    continue
                batch = Batch.of([Leaf(sub.args["node"], bytes.fromhex(x.sha256), x.work_units,
                                       x.step, x.counter) for x in info.leaves])
                index = batch.index_of(sha)
            except (WireHTTPError, OSError, ValueError, KeyError):
                continue
            if batch.id.hex() != bid:
                continue  # not that node's batch, or not these leaves
            b, f = await asyncio.to_thread(self.chain.works, [batch.id, bytes.fromhex(wid)])
            if b.status == WorkStatus.NONE or b.submitted_at >= f.submitted_at:
                continue
            return {"batch_id": bid, "index": index, "block": 0, "until": b.judge_until}
        return None

    def _leaf_jobs(self, wid: bytes) -> list[Job]:
        """The job of judging a file opened out of a batch of this pool (blocking): its leaf
        from `LeafOpened`, the pool and block from its batch's `BatchSubmitted`."""
        got = leaf_submission(self.chain, wid)
        if got is None or int(got[1].args["pool"]) != self.cfg.pool_id:
            return []
        leaf, batch = got
        info = self.chain.work(wid)
        return [Job(wid.hex(), bytes(leaf.args["file_sha256"]).hex(), leaf.args["node"],
                    info.provider, self.cfg.pool_id, int(leaf.args["units"]), batch.block,
                    batch.block_hash or self.chain.backend.block_hash(batch.block))]

    async def _post_verdicts(self, orch: SignedClient) -> None:
        for v in list(self.state.outgoing):
            if await self._post(v):
                self.state.posted(v)

    async def _post(self, v: Verdict) -> bool:
        """True when the orchestrator has the verdict (or never will need it)."""
        try:
            await self.orch.call("POST", "/verdicts", v)
        except NotAwaitingVerdict:
            return True  # the row has moved on (invalidated on chain): nothing left to tell
        except (NoSuchSubmission, NotSubmittedYet):
            return False  # the ledger has not seen the submission yet: try again later
        except (WireHTTPError, OSError):
            return False
        return True

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
