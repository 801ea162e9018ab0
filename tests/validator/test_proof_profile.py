"""The TOPLOC proof profile is a public rule of the pool: a validator judges by its profile's
thresholds ("any-hardware", the calibrated `Thresholds()`, unless configured otherwise) and
refuses to run by another profile than the one its orchestrator publishes."""

from __future__ import annotations

import asyncio

import pytest
from eth_account import Account
from helpers import PROVIDER, assignment, cheat_file, claim, roundtrip, rules, rules_server
from pydantic import ValidationError

from meshrl.toploc import Thresholds
from meshrl.validator.config import ValidatorConfig
from meshrl.validator.judge import replay_config
from meshrl.validator.node import PoolRulesError, ValidatorNode
from meshrl.validator.replay import ENGINE_THRESHOLDS, ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file
from meshrl.wire import SignedClient
from meshrl.worker.rollouts import generate_rollouts

# configs/network.toml's pool: 16 prompts x 8 completions of up to 8 tokens, one chunk each
DEMO = rules(max_new=8, prompts=16, group=8)


def test_default_validator_judges_by_the_calibrated_thresholds():
    assert ValidatorConfig().pool.proof_profile == "any-hardware"
    assert replay_config(ValidatorConfig()).thresholds == Thresholds()
    assert ReplayConfig().thresholds == Thresholds()
    tight = ValidatorConfig(pool={"proof_profile": "meshrl-cpu-engine"})
    assert replay_config(tight).thresholds == ENGINE_THRESHOLDS
    assert ENGINE_THRESHOLDS.min_pooled_chunks == 2 < Thresholds().min_pooled_chunks
    assert ENGINE_THRESHOLDS.max_pooled_mant_err_mean < Thresholds().max_pooled_mant_err_mean
    # an explicit replay.thresholds (experts only) replaces the profile's; tolerances stay
    expert = ValidatorConfig(pool={"proof_profile": "meshrl-cpu-engine"},
                             replay={"thresholds": Thresholds.paper().model_dump(),
                                     "logprob_atol": 0.1})
    got = replay_config(expert)
    assert got.thresholds == Thresholds.paper() and got.logprob_atol == 0.1
    with pytest.raises(ValidationError, match="proof_profile"):
        ValidatorConfig(pool={"proof_profile": "gpu"})
    with pytest.raises(KeyError, match="known: any-hardware, meshrl-cpu-engine"):
        profile_thresholds("gpu")


def test_validator_refuses_a_profile_the_pool_does_not_publish():
    async def check(mine: str, published: str, pool_id: int = 1) -> bool:
        async with rules_server(pool_id, proof_profile=published) as url:
            cfg = ValidatorConfig(orchestrator_url=url, pool={"proof_profile": mine})
            node = ValidatorNode(cfg, Account.create())
            async with SignedClient(url, node.account.key) as orch:
                return await node._check_rules(orch)

    assert asyncio.run(check("meshrl-cpu-engine", "meshrl-cpu-engine")) is True
    assert asyncio.run(check("any-hardware", "any-hardware")) is True
    with pytest.raises(PoolRulesError, match=r"publishes proof profile 'meshrl-cpu-engine', "
                       r"this validator's pool\.proof_profile is 'any-hardware'"):
        asyncio.run(check("any-hardware", "meshrl-cpu-engine"))
    with pytest.raises(PoolRulesError, match="publishes proof profile 'any-hardware'"):
        asyncio.run(check("meshrl-cpu-engine", "any-hardware"))
    with pytest.raises(PoolRulesError, match="manages pool 2, this validator's pool_id is 1"):
        asyncio.run(check("any-hardware", "any-hardware", pool_id=2))


@pytest.mark.parametrize("mode", ["scale-layer", "int8"])
def test_cpu_engine_profile_rejects_a_cheat_the_calibrated_one_cannot_pool(engine, model, tok,
                                                                           mode):
    """At the demo's size (128 chunks) both profiles reject the cheat and pass the honest file;
    at 8 chunks (the pool of tests/validator/network.py) only "meshrl-cpu-engine" pools them,
    and only it sees the cheat."""
    tight = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
    loose = ReplayConfig(thresholds=profile_thresholds("any-hardware"))
    small = rules(max_new=16, prompts=2, group=4)
    for r in (DEMO, small):
        honest = roundtrip(generate_rollouts(engine, tok, assignment(r), PROVIDER))[0]
        for cfg in (tight, loose):
            rep = verify_file(engine, tok, honest, claim(honest), r, cfg)
            assert rep.accepted, rep.reason()
        bad = cheat_file(engine, model, tok, r, mode)
        rep = verify_file(engine, tok, bad, claim(bad), r, tight)
        assert not rep.accepted and rep.hard and [f.check for f in rep.findings] == ["toploc"]
    assert rep.stats.chunks == 8 and rep.stats.pooled["exp_mismatch_rate"] > 0.005
    assert "rollout: exponent mismatch rate" in rep.reason()
    assert verify_file(engine, tok, bad, claim(bad), small, loose).accepted  # < 16 chunks
    demo_bad = cheat_file(engine, model, tok, DEMO, mode)
    rep = verify_file(engine, tok, demo_bad, claim(demo_bad), DEMO, loose)
    assert not rep.accepted and rep.stats.chunks == 128
