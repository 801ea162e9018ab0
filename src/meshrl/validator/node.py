"""The validator process: follow `WorkSubmitted`, judge each file, act on the verdict.

At start the pool's published rules are read (`GET /rules`): a validator whose
`pool.proof_profile` is not the pool's refuses to run, since workers stake on the published one.
Each loop: poll the chain from the persisted cursor and queue the pool's new submissions;
take the due jobs, download and parse their files, group them by policy version and verify each
group with shared prefill batches; then act: a hard verdict calls `hard_invalidate` (slash,
eject), a soft one `soft_invalidate`, an accepted file is reported to the orchestrator; every
verdict goes to the orchestrator's ledger with its reason. Failures of the validator itself
(download, missing policy version, an exception in its own code) retry the job with backoff and
end, at worst, in a soft invalidation.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

from eth_account.signers.local import LocalAccount

from meshrl.log import get_logger, log_event
from meshrl.protocol import Deployment, Protocol, TxReverted, WorkStatus
from meshrl.protocol.local import connect
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.judge import Judge, Outcome
from meshrl.validator.policy import Decision, backoff_delay, give_up
from meshrl.validator.state import Job, ValidatorState
from meshrl.wire import (
    NoSuchSubmission,
    NotAwaitingVerdict,
    NotSubmittedYet,
    SignedClient,
    WireHTTPError,
)
from meshrl.wire.models import PublishedRules, Verdict, VerdictKind

__all__ = ["PoolRulesError", "ValidatorNode"]

log = get_logger("meshrl.validator")
_KIND = {"accept": VerdictKind.ACCEPT, "soft": VerdictKind.SOFT_INVALID,
         "hard": VerdictKind.HARD_INVALID}


class PoolRulesError(RuntimeError):
    """The validator's `[pool]` rules disagree with the ones its orchestrator publishes."""


class ValidatorNode:
    def __init__(self, cfg: ValidatorConfig, account: LocalAccount) -> None:
        self.cfg, self.account = cfg, account
        self.stop = asyncio.Event()
        self.judged = 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        dep = Deployment.load(self.cfg.chain.deployment)
        self.chain = Protocol(connect(self.cfg.chain), dep, self.account)
        if not await asyncio.to_thread(self.chain.is_validator, self.account.address):
            log_event(log, "this key has no validator role: invalidations will revert",
                      address=self.account.address)
        self.state = ValidatorState.load(f"{self.cfg.work_dir}/state.json", dep.block)
        self.cursor = self.chain.events(self.state.next_block)
        async with SignedClient(self.cfg.orchestrator_url, self.account.key) as orch:
            self.orch = orch
            if not await self._check_rules(orch):
                return 0  # stopped before the orchestrator answered
            self.judge = Judge(self.cfg, orch)
            while not self.stop.is_set() and not self._enough():
                await self._poll()
                await self._post_verdicts(orch)
                due = [j for j in self.state.queue if j.not_before <= time.time()]
                if due:
                    await self._judge(due[: self.cfg.batch_files])
                else:
                    await self._sleep(self.cfg.poll_interval)
            await self._post_verdicts(orch)
        log_event(log, "stopped", judged=self.judged)
        return 0

    async def _check_rules(self, orch: SignedClient) -> bool:
        """Refuse to judge by another proof profile than the pool publishes (a worker stakes
        on the published one); wait for an orchestrator that does not answer yet."""
        while True:
            try:
                rules = await orch.call("GET", "/rules", response=PublishedRules)
                break
            except (WireHTTPError, OSError) as e:
                if isinstance(e, WireHTTPError) and 400 <= e.status < 500 and e.status != 429:
                    raise PoolRulesError(f"cannot read the pool's rules: {e}") from None
                log_event(log, "pool rules not readable yet", error=str(e))
                await self._sleep(self.cfg.poll_interval)
                if self.stop.is_set():
                    return False
        if rules.pool_id != self.cfg.pool_id:
            raise PoolRulesError(f"the orchestrator at {self.cfg.orchestrator_url} manages pool "
                                 f"{rules.pool_id}, this validator's pool_id is "
                                 f"{self.cfg.pool_id}")
        mine = self.cfg.pool.proof_profile
        if rules.proof_profile != mine:
            raise PoolRulesError(
                f"the orchestrator at {self.cfg.orchestrator_url} publishes proof "
                f"profile {rules.proof_profile!r}, this validator's pool.proof_profile is "
                f"{mine!r}: set it to the pool's")
        overridden = "thresholds" in self.cfg.replay
        log_event(log, "proof profile", profile=mine, thresholds_overridden=overridden)
        return True

    def _enough(self) -> bool:
        return self.cfg.max_files > 0 and self.judged >= self.cfg.max_files

    async def _poll(self) -> None:
        events = await asyncio.to_thread(self.cursor.poll)
        jobs = []
        for e in events:
            if e.name != "WorkSubmitted" or int(e.args["pool"]) != self.cfg.pool_id:
                continue
            wid = bytes(e.args["work_id"])
            info = await asyncio.to_thread(self.chain.work, wid)
            jobs.append(Job(wid.hex(), bytes(e.args["file_sha256"]).hex(), e.args["node"],
                            info.provider, self.cfg.pool_id, int(e.args["units"]), e.block))
        if jobs or events:
            self.state.enqueue(jobs, self.cursor.next_block)
        elif self.cursor.next_block != self.state.next_block:
            self.state.enqueue([], self.cursor.next_block)
        if jobs:
            log_event(log, "submissions queued", files=len(jobs), queue=len(self.state.queue))

    async def _judge(self, jobs: list[Job]) -> None:
        outcomes = await self.judge.judge(jobs)
        for job, out in zip(jobs, outcomes, strict=True):
            if out.error is not None:
                await self._retry(job, out.error)
            else:
                await self._act(job, out)

    async def _retry(self, job: Job, error: str) -> None:
        job.attempts += 1
        job.last_error = error
        if job.attempts >= self.cfg.retry.max_attempts:
            await self._act(job, Outcome(decision=give_up(error, job.attempts)))
            return
        job.not_before = time.time() + backoff_delay(job.attempts, self.cfg.retry)
        self.state.save()
        log_event(log, "retry later", sha256=job.sha256, attempt=job.attempts, error=error)

    async def _act(self, job: Job, out: Outcome) -> None:
        """Post the verdict (reason and numbers) first, so the ledger row carries it when the
        chain's invalidation event reaches the orchestrator; then invalidate on chain."""
        d = out.decision
        assert d is not None
        # addressed by work id: every submission has its own ledger row (a copy's included)
        verdict: dict[str, str] | None = {"sha256": job.sha256, "work_id": job.work_id,
                                          "verdict": _KIND[d.kind].value,
                                          "reason": d.reason[:500]}
        if verdict is not None and await self._post(verdict):
            verdict = None
        tx = await self._invalidate(job, d) if d.kind != "accept" else ""
        self.state.record(job, d.kind, verdict)  # a verdict not yet posted is kept for later
        self.judged += 1
        log_event(log, "verdict", sha256=job.sha256, node=job.node, verdict=d.kind,
                  reason=d.reason, checks=list(d.checks), tx=tx, stats=out.stats)

    async def _invalidate(self, job: Job, d: Decision) -> str:
        wid = bytes.fromhex(job.work_id)
        info = await asyncio.to_thread(self.chain.work, wid)
        if info.status != WorkStatus.SUBMITTED:  # done before a crash, or by another validator
            return ""
        fn = self.chain.hard_invalidate if d.kind == "hard" else self.chain.soft_invalidate
        try:
            return (await asyncio.to_thread(fn, wid)).tx_hash
        except TxReverted as e:
            log_event(log, "invalidation refused", sha256=job.sha256, error=str(e))
            return ""

    async def _post_verdicts(self, orch: SignedClient) -> None:
        for v in list(self.state.outgoing):
            if await self._post(v):
                self.state.posted(v)

    async def _post(self, v: dict[str, str]) -> bool:
        """True when the orchestrator has the verdict (or never will need it)."""
        try:
            await self.orch.call("POST", "/verdicts", Verdict(**v))
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
