"""Judging a batch of submissions: download, parse, group by policy version, verify together.

Every file is judged by the pool's published rules (`GET /rules`, read at start), never by a
local copy. What the validator cannot do (download, fetch the policy version, a crash of its
own) comes back as `Unjudged` for the caller to retry; what the file shows comes back as a
`meshrl.pool.Decision`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from meshrl.log import get_logger
from meshrl.pool import (
    Check,
    Decision,
    Finding,
    PoolRules,
    PoolRulesError,
    Severity,
    decide,
    file_limits,
    unmet_profile,
)
from meshrl.validator.checks import check_node, check_sha256, check_slot_claim
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.models import ModelCache, VersionUnavailable
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.state import Job
from meshrl.validator.verify import ChainClaim, model_free_findings, verify_files
from meshrl.wire import RolloutFileError, SignedClient, WireHTTPError
from meshrl.wire.detached import detached
from meshrl.wire.isolated import read_rollout_files_isolated
from meshrl.wire.models import LedgerEntry, LedgerPage
from meshrl.wire.rollout_file import RolloutFile

__all__ = ["Judge", "Unjudged", "replay_config"]

log = get_logger("meshrl.validator")


@dataclass(frozen=True)
class Unjudged:
    """The validator could not judge the file (its own failure, never the worker's): retry."""

    error: str


def replay_config(cfg: ValidatorConfig, rules: PoolRules) -> ReplayConfig:
    """The replay tolerances: the published proof profile's TOPLOC thresholds unless
    `replay.thresholds` replaces them (experts only: the workers of the pool judge their risk
    by the profile)."""
    return ReplayConfig.model_validate(
        {"thresholds": profile_thresholds(rules.proof_profile), **cfg.replay})


class Judge:
    def __init__(self, cfg: ValidatorConfig, rules: PoolRules, orch: SignedClient) -> None:
        self.cfg, self.rules, self.orch = cfg, rules, orch
        why = unmet_profile(rules.proof_profile, cfg.dtype, cfg.backend, "validator")
        if why is not None:  # it would slash honest work (issue #41): never judge with it
            raise PoolRulesError(why)
        self.tasks = rules.task.build()  # once: a math task reads its data file here
        self.replay = replay_config(cfg, rules)
        # what a file of this pool may hold, checked first; its proofs those it is verified by
        self.limits = file_limits(rules, toploc_chunk_size=self.replay.chunk_size,
                                  toploc_topk=self.replay.topk)
        self.models = ModelCache(cfg.work_dir, cfg.model_dir, cfg.shardcast_servers, cfg.engine,
                                 signer=rules.policy_signer, backend=cfg.backend,
                                 device=cfg.device, dtype=cfg.dtype,
                                 prompt_format=rules.prompt_format, run=rules.policy_run())
        self.models.check_prompt_format()  # a chat pool on a policy without a template

    async def judge(self, jobs: list[Job]) -> list[Decision | Unjudged]:
        outs: list[Decision | Unjudged | None] = [None] * len(jobs)
        files: dict[int, tuple[RolloutFile, list[Finding]]] = {}
        datas: dict[int, bytes] = {}
        for i, job in enumerate(jobs):
            got = await self._download(job)
            if isinstance(got, bytes):
                datas[i] = got
            else:
                outs[i] = got
        # every file of the batch parsed in one isolated child (one fork, not one a file; a
        # file that kills the child is read again alone, so it costs only itself)
        parsed = await detached(read_rollout_files_isolated, list(datas.values()),
                                         self.limits)
        for i, rf in zip(datas, parsed, strict=True):
            if isinstance(rf, RolloutFileError):
                # hard: these bytes are the ones the worker signed on chain (sha256 checked),
                # and an honest worker's writer never makes a file its reader refuses
                outs[i] = decide([Finding(Check.SCHEMA, Severity.HARD, str(rf))])
                continue
            res = await self._examine(jobs[i], rf)
            if isinstance(res, tuple):
                files[i] = res
            else:
                outs[i] = res
        by_version: dict[int, list[int]] = defaultdict(list)
        for i, (rf, _) in files.items():
            by_version[rf.header.policy_version].append(i)
        for version, idx in by_version.items():
            try:
                engine = await self.models.get(version)
            except VersionUnavailable as e:
                for i in idx:  # what needs no model is final: a hard finding is not retried
                    outs[i] = self._without_model(files[i][0], jobs[i], files[i][1], str(e))
                continue
            items = [(files[i][0], _claim(jobs[i])) for i in idx]
            prior = [files[i][1] for i in idx]
            try:
                decisions = await detached(
                    verify_files, engine, self.models.tokenizer, items, self.rules, self.tasks,
                    self.replay, prior)
            except Exception as e:  # a bug or resource error of ours: never the worker's fault
                log.exception("verification crashed")
                for i in idx:
                    outs[i] = Unjudged(f"validator error: {type(e).__name__}: {e}")
                continue
            for i, d in zip(idx, decisions, strict=True):
                outs[i] = d
        return [o if o is not None else Unjudged("not judged") for o in outs]

    def _without_model(self, rf: RolloutFile, job: Job, prior: list[Finding],
                       why: str) -> Decision | Unjudged:
        """A file whose policy version cannot be had: hard if a check that needs no model
        fails (a false version claim cannot buy a retry), else judged later."""
        found = prior + model_free_findings(rf, _claim(job), self.rules, self.tasks,
                                            self.models.tokenizer)
        hard = [f for f in found if f.severity is Severity.HARD]
        return decide(hard) if hard else Unjudged(why)

    async def _download(self, job: Job) -> bytes | Unjudged:
        try:
            data = await self.orch.get_bytes(f"/files/{job.sha256}")
        except (WireHTTPError, OSError, TimeoutError) as e:
            return Unjudged(f"download: {e}")
        bad = check_sha256(data, job.sha256)
        if bad is not None:  # a broken transfer or store: ours to retry
            return Unjudged(bad.text())
        return data

    async def _examine(self, job: Job, rf: RolloutFile,
                       ) -> tuple[RolloutFile, list[Finding]] | Decision:
        """The checks of a parsed file against its submission and ledger row (node, slot)."""
        h = rf.header
        if h.node.lower() != job.node.lower():
            f = check_node(h.node, h.provider, job.node, job.provider)
            return decide([f] if f else [])
        findings = []
        entry = await self._ledger_entry(job)
        # only a granted row holds what this node was granted (a copy's holds the original's)
        if entry is not None and entry.granted and entry.node.lower() == job.node.lower():
            counters = {r.counter for r in rf.completions}
            slot = check_slot_claim(
                {"policy_version": h.policy_version, "work_units": h.work_units,
                 "counter": counters.pop() if len(counters) == 1 else -1},
                {"policy_version": entry.policy_version, "work_units": entry.work_units,
                 "counter": entry.counter})
            findings += [slot] if slot is not None else []
        return rf, findings

    async def _ledger_entry(self, job: Job) -> LedgerEntry | None:
        """The ledger row of this submission: by its work id, or (when the orchestrator has not
        seen the submission yet) the file's row granted to the submitting node."""
        try:
            page = await self.orch.call("GET", "/ledger", response=LedgerPage,
                                        query={"sha256": job.sha256})
        except (WireHTTPError, OSError):
            return None
        for e in page.entries:
            if e.work_id == job.work_id:
                return e
        return next((e for e in page.entries
                     if e.granted and e.node.lower() == job.node.lower()), None)


def _claim(job: Job) -> ChainClaim:
    return ChainClaim(job.sha256, job.node, job.provider, job.units, job.block_hash)
