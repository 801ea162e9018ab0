"""The TOPLOC proof profile is a public rule of the pool: a validator judges by the thresholds of
the profile its orchestrator publishes ("any-hardware", the calibrated `Thresholds()`, unless
the pool says otherwise), and refuses to start when its own `[rules]` pin another one."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys

import pytest
import torch
from eth_account import Account
from helpers import cheat_file, claim, honest_file, rules, rules_server
from pydantic import ValidationError

from meshrl.inference.reference import ReferenceBackend
from meshrl.pool import Check, PoolRules, PoolRulesError, VerdictKind, profile
from meshrl.toploc import Thresholds
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.judge import Judge, replay_config
from meshrl.validator.node import ValidatorNode
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import compute_dtype, verify_file
from meshrl.wire import SignedClient

# configs/network.toml's pool: 16 prompts x 8 completions of up to 8 tokens, one chunk each
DEMO = rules(max_new=8, prompts=16, group=8)
ENGINE_THRESHOLDS = profile_thresholds("meshrl-cpu-engine")


def test_validator_judges_by_the_published_profiles_thresholds():
    assert ValidatorConfig().rules.proof_profile is None  # unpinned: taken as published
    assert PoolRules(pool_id=1).proof_profile == "any-hardware"
    assert replay_config(ValidatorConfig(), PoolRules(pool_id=1)).thresholds == Thresholds()
    assert ReplayConfig().thresholds == Thresholds()
    tight = PoolRules(pool_id=1, proof_profile="meshrl-cpu-engine")
    assert replay_config(ValidatorConfig(), tight).thresholds == ENGINE_THRESHOLDS
    assert Thresholds(**profile("meshrl-cpu-engine").thresholds) == ENGINE_THRESHOLDS
    assert ENGINE_THRESHOLDS.pooled_full_chunks == 1 < Thresholds().pooled_full_chunks
    assert ENGINE_THRESHOLDS.max_pooled_mant_err_mean < Thresholds().max_pooled_mant_err_mean
    # an explicit replay.thresholds (experts only) replaces the profile's; tolerances stay
    expert = ValidatorConfig(replay={"thresholds": Thresholds.paper().model_dump(),
                                     "logprob_atol": 0.1})
    got = replay_config(expert, tight)
    assert got.thresholds == Thresholds.paper() and got.logprob_atol == 0.1
    with pytest.raises(ValidationError, match="proof_profile"):
        ValidatorConfig(rules={"proof_profile": "gpu"})
    with pytest.raises(KeyError, match="known: any-hardware, meshrl-cpu-engine"):
        profile_thresholds("gpu")


def test_validator_refuses_a_profile_the_pool_does_not_publish():
    async def check(mine: str | None, published: str, pool_id: int = 1) -> PoolRules | None:
        async with rules_server(pool_id, proof_profile=published) as url:
            cfg = ValidatorConfig(orchestrator_url=url, rules={"proof_profile": mine})
            node = ValidatorNode(cfg, Account.create())
            async with SignedClient(url, node.account.key) as orch:
                return await node._rules(orch)

    for mine, published in [("meshrl-cpu-engine", "meshrl-cpu-engine"),
                            ("any-hardware", "any-hardware"), (None, "meshrl-cpu-engine")]:
        assert asyncio.run(check(mine, published)).proof_profile == published
    with pytest.raises(PoolRulesError, match=r"rules\.proof_profile: configured 'any-hardware', "
                       r"the pool publishes 'meshrl-cpu-engine'"):
        asyncio.run(check("any-hardware", "meshrl-cpu-engine"))
    with pytest.raises(PoolRulesError, match=r"rules\.proof_profile: configured "
                       r"'meshrl-cpu-engine', the pool publishes 'any-hardware'"):
        asyncio.run(check("meshrl-cpu-engine", "any-hardware"))
    with pytest.raises(PoolRulesError, match="manages pool 2, this validator's pool_id is 1"):
        asyncio.run(check("any-hardware", "any-hardware", pool_id=2))


@pytest.mark.parametrize("mode", ["scale-layer", "int8"])
def test_cpu_engine_profile_rejects_a_cheat_the_calibrated_one_cannot_pool(engine, model, tok,
                                                                           mode):
    """At the demo's size (128 chunks) both profiles reject the cheat and pass the honest file;
    at 8 chunks (the pool of tests/validator/network.py) "meshrl-cpu-engine" sees the cheat
    at its thresholds, the calibrated one only against thresholds widened for the size."""
    tight = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
    loose = ReplayConfig(thresholds=profile_thresholds("any-hardware"))
    small = rules(max_new=16, prompts=2, group=4)
    for r in (DEMO, small):
        tasks = r.task.build()
        honest = honest_file(engine, tok, r)
        for cfg in (tight, loose):
            d = verify_file(engine, tok, honest, claim(honest), r, tasks, cfg)
            assert d.accepted, d.reason
        bad = cheat_file(engine, model, tok, r, mode)
        d = verify_file(engine, tok, bad, claim(bad), r, tasks, tight)
        # its tokens and log-probs (float32 exact under this profile) betray it too
        assert d.kind is VerdictKind.HARD_INVALID and Check.TOPLOC in d.checks, d.reason
    assert d.stats["chunks"] == 8 and d.stats["pooled"]["exp_mismatch_rate"] > 0.005
    assert "rollout: exponent mismatch rate" in d.reason
    # since issue #22 the calibrated profile pools short files too, its thresholds x
    # sqrt(16 / n); since issue #26 n counts the chunks of at least 8 x topk values only (a
    # completion that ended early leaves a small chunk, judged apart)
    d = verify_file(engine, tok, bad, claim(bad), small, small.task.build(), loose)
    full = sum(len(c.completion_tokens) >= 8 for c in bad.completions)
    assert 1 <= full <= 8
    assert d.stats["pooled_limits"]["mant_err_mean"] == pytest.approx(0.78 * (16 / full) ** 0.5)
    demo_bad = cheat_file(engine, model, tok, DEMO, mode)
    d = verify_file(engine, tok, demo_bad, claim(demo_bad), DEMO, DEMO.task.build(), loose)
    assert not d.accepted and d.stats["chunks"] == 128


def test_a_validator_whose_dtype_cannot_honour_the_profile_is_refused():
    """Issue #41 (high): a validator recomputing in bfloat16 or float16 hard-invalidated honest
    float32 work under "meshrl-cpu-engine" (80 of 80 files, 60 of 80). Like a worker, it is
    refused: a pinned profile at config load, the published one at start (`PoolRulesError`,
    exit `EXIT_REFUSED`, one line)."""
    for dtype in ("bfloat16", "float16"):
        with pytest.raises(ValidationError, match=f"this validator computes in {dtype}"):
            ValidatorConfig(backend="reference", dtype=dtype,
                            rules={"proof_profile": "meshrl-cpu-engine"})
        ValidatorConfig(backend="reference", dtype=dtype, rules={"proof_profile": "any-hardware"})

    async def start(dtype: str, published: str) -> PoolRules | None:
        async with rules_server(1, proof_profile=published) as url:
            cfg = ValidatorConfig(orchestrator_url=url, backend="reference", dtype=dtype)
            node = ValidatorNode(cfg, Account.create())
            async with SignedClient(url, node.account.key) as orch:
                return await node._rules(orch)

    assert asyncio.run(start("bfloat16", "any-hardware")).proof_profile == "any-hardware"
    assert asyncio.run(start("float32", "meshrl-cpu-engine")).proof_profile == \
        "meshrl-cpu-engine"
    with pytest.raises(PoolRulesError, match=r"^the pool's proof profile 'meshrl-cpu-engine' "
                       r"holds only for float32 compute, and this validator computes in "
                       r"bfloat16 \(backend 'reference'\): it would slash honest float32 work"):
        asyncio.run(start("bfloat16", "meshrl-cpu-engine"))
    tight = PoolRules(pool_id=1, proof_profile="meshrl-cpu-engine")
    with pytest.raises(PoolRulesError, match="this validator computes in float16"):
        Judge(ValidatorConfig(backend="reference", dtype="float16"), tight, None)


def test_the_cli_refuses_a_bfloat16_validator_for_the_cpu_engine_profile_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "meshrl.cli", "validator", "--backend", "reference", "--dtype",
         "bfloat16", "--rules.proof_profile", "meshrl-cpu-engine"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "this validator computes in bfloat16" in lines[0], lines


def test_an_honest_file_is_never_slashed_by_a_validator_that_cannot_honour_its_profile(
        engine, model, tok):
    """The replay of a validator whose compute dtype the profile does not hold for abstains: an
    honest float32 file is a soft `validator_error` (never a slash) under "meshrl-cpu-engine"
    (before: hard `toploc`/`logprobs`), judged as usual under "any-hardware"; a file that a
    check needing no model convicts is still hard."""
    r = rules(max_new=16, prompts=2, group=4)
    tight = r.model_copy(update={"proof_profile": "meshrl-cpu-engine"})
    tasks = r.task.build()
    honest, loose = honest_file(engine, tok, tight), honest_file(engine, tok, r)
    bf16 = ReferenceBackend(copy.deepcopy(model).to(torch.bfloat16), tok)
    assert compute_dtype(bf16) == "bfloat16" and compute_dtype(engine) == "float32"
    replay = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
    d = verify_file(bf16, tok, honest, claim(honest), tight, tasks, replay)
    assert d.kind is VerdictKind.SOFT_INVALID and d.checks == (Check.VALIDATOR_ERROR,), d.reason
    assert "abstained from the replay" in d.reason and "computes in bfloat16" in d.reason
    d = verify_file(bf16, tok, loose, claim(loose), r, tasks,
                    ReplayConfig(thresholds=profile_thresholds("any-hardware")))
    assert d.accepted, d.reason
    d = verify_file(engine, tok, honest, claim(honest), tight, tasks, replay)
    assert d.accepted, d.reason
    lying = claim(honest, units=honest.header.work_units + 1)
    d = verify_file(bf16, tok, honest, lying, tight, tasks, replay)
    assert d.kind is VerdictKind.HARD_INVALID and Check.WORK_UNITS in d.checks, d.reason
