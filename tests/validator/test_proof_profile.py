"""The TOPLOC proof profile is a public rule of the pool: a validator judges by the thresholds of
the profile its orchestrator publishes ("any-hardware", the calibrated `Thresholds()`, unless
the pool says otherwise), and refuses to start when its own `[rules]` pin another one."""

from __future__ import annotations

import asyncio

import pytest
from eth_account import Account
from helpers import cheat_file, claim, honest_file, rules, rules_server
from pydantic import ValidationError

from meshrl.pool import Check, PoolRules, PoolRulesError, VerdictKind, profile
from meshrl.toploc import Thresholds
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.judge import replay_config
from meshrl.validator.node import ValidatorNode
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file
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
