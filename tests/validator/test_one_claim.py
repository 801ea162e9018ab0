"""One generation, paid once: a file's problems and sampling noise are bound to everything that
makes its piece of work distinct (node, step, counter and policy version), and a node's counters
at a step are 0 .. files_per_step - 1. A generation relabeled as another policy version (the
same weights: the worst case of a tiny learning rate) or made at a counter outside the range
is a hard finding, and what needs no model is final even when the version cannot be had."""

from __future__ import annotations

import asyncio

import pytest
from helpers import assignment, claim, honest_file, roundtrip, rules

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.pool import Check, Finding, Severity, VerdictKind, file_limits
from meshrl.validator.judge import Judge, Unjudged
from meshrl.validator.models import VersionUnavailable
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.state import Job
from meshrl.validator.verify import verify_file
from meshrl.wire.rollout_file import RolloutFile, rollout_file_bytes

ENGINE = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))


def _at_version(model, tok, version: int) -> CPUEngine:
    """The validator's engine holding `model`'s weights as policy version `version`."""
    e = CPUEngine(model, tok, EngineConfig(num_threads=1))
    e.load_weights(model.state_dict(), version)
    return e


def _relabeled(rf: RolloutFile, version: int, reseed: bool) -> RolloutFile:
    h = rf.header.model_copy(update={"policy_version": version})
    if reseed:  # a careful cheater also writes the seed the claimed version would have
        a = assignment(rules(max_new=16), version=version)
        h = h.model_copy(update={"sampling_seed": a.sampler_seed()})
    return roundtrip(RolloutFile(h, rf.completions))[0]


def test_the_same_weights_under_the_next_version_judge_the_honest_file(model, tok):
    # the control: a file honestly generated at version 1 (same weights as version 0)
    r = rules(max_new=16)
    v1 = _at_version(model, tok, 1)
    b = honest_file(v1, tok, r, version=1)
    d = verify_file(v1, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.accepted, d.reason


@pytest.mark.parametrize("reseed", [False, True], ids=["as-is", "reseeded"])
@pytest.mark.parametrize("claimed", [1, 2])
def test_one_generation_claimed_under_another_version_is_hard(model, tok, engine, claimed,
                                                               reseed):
    """Version 0's file claimed as version 1 or 2, judged by an engine whose weights are
    exactly version 0's: the claimed version's problems are other problems."""
    r = rules(max_new=16)
    b = honest_file(engine, tok, r, version=0)
    fake = _relabeled(b, claimed, reseed)
    d = verify_file(_at_version(model, tok, claimed), tok, fake, claim(fake), r,
                    r.task.build(), ENGINE)
    assert d.kind is VerdictKind.HARD_INVALID, d.reason
    assert Check.PROMPTS in d.checks
    assert (Check.SAMPLING_SEED in d.checks) is not reseed


@pytest.mark.parametrize("counter", [8, 2**40 + 7])
def test_a_counter_outside_files_per_step_is_hard(engine, tok, counter):
    r = rules(max_new=8)  # files_per_step 8: counters 0..7
    b = honest_file(engine, tok, r, counter=counter)
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.COUNTER,), d.reason
    last = honest_file(engine, tok, r, counter=7)
    assert verify_file(engine, tok, last, claim(last), r, r.task.build(), ENGINE).accepted


class _NoModels:
    """A model cache that can fetch no version (shardcast down, or a version never published)."""

    tokenizer = None

    async def get(self, version: int):
        raise VersionUnavailable(f"policy version {version} is not on any server")


def _judge_without_models(r, files: list[RolloutFile], prior: list | None = None) -> list:
    j = Judge.__new__(Judge)
    j.rules, j.tasks, j.models, j.limits = r, r.task.build(), _NoModels(), file_limits(r)

    async def downloaded(job: Job) -> bytes:  # the file's bytes (parsed in the reader child)
        return rollout_file_bytes(files[int(job.sha256[:2], 16)])

    async def examined(job: Job, rf: RolloutFile):  # the slot and ledger checks' findings
        return rf, (prior or [[]] * len(files))[int(job.sha256[:2], 16)]
    j._download, j._examine = downloaded, examined  # type: ignore[method-assign]
    jobs = [Job(work_id=f"{i:064x}", sha256=f"{i:02x}" + "0" * 62, node=f.header.node,
                provider=f.header.provider, pool=1, units=f.header.work_units, block=1)
            for i, f in enumerate(files)]
    return asyncio.run(j.judge(jobs))


def test_what_needs_no_model_is_final_when_the_version_cannot_be_had(engine, tok):
    """A false claim (here a counter out of range, or units the chain was not told) used to
    become a soft verdict when the claimed version could not be fetched; an honest file of an
    unavailable version is retried later, never judged without its model."""
    r = rules(max_new=8)
    honest = honest_file(engine, tok, r)
    grinder = honest_file(engine, tok, r, counter=9)
    out = _judge_without_models(r, [honest, grinder])
    assert isinstance(out[0], Unjudged)
    assert out[1].kind is VerdictKind.HARD_INVALID and out[1].checks == (Check.COUNTER,)


def test_a_false_slot_claim_stays_hard_when_the_claimed_version_cannot_be_had(engine, tok):
    """The issue's case: a slot claiming a version the validator cannot fetch."""
    r = rules(max_new=8)
    b = honest_file(engine, tok, r)
    slot = Finding(Check.SLOT_CLAIM, Severity.HARD, "the file's claims differ from its slot",
                   {"policy_version": "0/1"})
    [d] = _judge_without_models(r, [b], prior=[[slot]])
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.SLOT_CLAIM,)
