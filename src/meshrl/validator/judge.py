"""Judging a batch of submissions: download, parse, group by policy version, verify together.

What the validator cannot do (download, fetch the policy version) comes back as `Outcome.error`
for the caller to retry; what the file shows comes back as a `Decision`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from meshrl.log import get_logger
from meshrl.validator.checks import Finding, check_node, check_sha256, check_slot_claim
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.models import ModelCache, VersionUnavailable
from meshrl.validator.policy import Decision, decide
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.state import Job
from meshrl.validator.verify import ChainClaim, PoolRules, verify_files
from meshrl.wire import RolloutFileError, SignedClient, WireHTTPError
from meshrl.wire.models import LedgerEntry, LedgerPage
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file

__all__ = ["Judge", "Outcome", "pool_rules", "replay_config"]

log = get_logger("meshrl.validator")


@dataclass
class Outcome:
    decision: Decision | None = None
    error: str | None = None  # the validator's own failure: retry
    stats: dict[str, Any] = field(default_factory=dict)


def pool_rules(cfg: ValidatorConfig) -> PoolRules:
    from meshrl.tasks import TasksConfig

    p = cfg.pool
    task = p.task if "mix" in p.task else {"mix": [p.task]}
    sampling = dict(p.sampling)
    group = int(sampling.pop("group_size", 1))
    return PoolRules(seed=p.seed, async_level=p.async_level, prompts_per_file=p.prompts_per_file,
                     group_size=group, sampling=sampling,
                     tasks=TasksConfig.model_validate(task))


def replay_config(cfg: ValidatorConfig) -> ReplayConfig:
    """The replay tolerances: the proof profile's TOPLOC thresholds unless `replay.thresholds`
    replaces them (experts only: the workers of the pool judge their risk by the profile)."""
    return ReplayConfig.model_validate(
        {"thresholds": profile_thresholds(cfg.pool.proof_profile), **cfg.replay})


class Judge:
    def __init__(self, cfg: ValidatorConfig, orch: SignedClient) -> None:
        self.cfg, self.orch = cfg, orch
        self.rules = pool_rules(cfg)
        self.replay = replay_config(cfg)
        self.models = ModelCache(cfg.work_dir, cfg.model_dir, cfg.pool.shardcast_servers,
                                 cfg.engine)

    async def judge(self, jobs: list[Job]) -> list[Outcome]:
        outs: list[Outcome | None] = [None] * len(jobs)
        files: dict[int, tuple[RolloutFile, list[Finding]]] = {}
        for i, job in enumerate(jobs):
            res = await self._fetch(job)
            if isinstance(res, Outcome):
                outs[i] = res
            else:
                files[i] = res
        by_version: dict[int, list[int]] = defaultdict(list)
        for i, (rf, _) in files.items():
            by_version[rf.header.policy_version].append(i)
        for version, idx in by_version.items():
            try:
                engine = await self.models.get(version)
            except VersionUnavailable as e:
                for i in idx:
                    outs[i] = Outcome(error=str(e))
                continue
            items = [(files[i][0], _claim(jobs[i]), self.rules) for i in idx]
            try:
                reports = await asyncio.to_thread(verify_files, engine, self.models.tokenizer,
                                                  items, self.replay)
            except Exception as e:  # a bug or resource error of ours: never the worker's fault
                log.exception("verification crashed")
                for i in idx:
                    outs[i] = Outcome(error=f"validator error: {type(e).__name__}: {e}")
                continue
            for i, rep in zip(idx, reports, strict=True):
                findings = files[i][1] + rep.findings
                outs[i] = Outcome(decide(findings), stats={} if rep.stats is None else
                                  asdict(rep.stats))
        return [o if o is not None else Outcome(error="not judged") for o in outs]

    async def _fetch(self, job: Job) -> tuple[RolloutFile, list[Finding]] | Outcome:
        try:
            data = await self.orch.get_bytes(f"/files/{job.sha256}")
        except (WireHTTPError, OSError, TimeoutError) as e:
            return Outcome(error=f"download: {e}")
        bad = check_sha256(data, job.sha256)
        if bad is not None:  # a broken transfer or store: ours to retry
            return Outcome(error=bad.text())
        try:
            rf = read_rollout_file(data)
        except RolloutFileError as e:
            return Outcome(decide([Finding("schema", "soft", str(e))]))
        h = rf.header
        if h.node.lower() != job.node.lower():
            f = check_node(h.node, h.provider, job.node, job.provider)
            return Outcome(decide([f] if f else []))
        findings = []
        entry = await self._ledger_entry(job)
        # only a granted row holds what this node was granted (a copy's holds the original's)
        if entry is not None and entry.granted and entry.node.lower() == job.node.lower():
            slot = check_slot_claim(
                {"step": h.step, "policy_version": h.policy_version, "work_units": h.work_units},
                {"step": entry.step, "policy_version": entry.policy_version,
                 "work_units": entry.work_units})
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
    return ChainClaim(job.sha256, job.node, job.provider, job.units)
