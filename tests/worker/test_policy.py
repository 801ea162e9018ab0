"""Policy versions through a real shardcast origin on loopback: the worker starts on the newest
allowed version, follows new ones and hot-loads them while it keeps generating; the validator's
model cache fetches the version a file names, loads it once, and reports one it cannot fetch.
Both believe only versions signed by the rules' policy signer, and refuse a pool that names
none."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from helpers import TASKS

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import Assignment, PoolRules, PoolRulesError, WorkOrder
from meshrl.shardcast import Origin, OriginConfig
from meshrl.shardcast.config import ServerConfig
from meshrl.validator.models import ModelCache, VersionUnavailable
from meshrl.wire.signing import address_of
from meshrl.worker.config import WorkerConfig
from meshrl.worker.policy import PolicyHolder

TRAINER_KEY = "0x" + "7e" * 32
RULES = PoolRules(pool_id=1, async_level=1, task=TASKS, sampling={"max_new_tokens": 8},
                  group_size=2, seed=3, prompts_per_file=2,
                  policy_signer=address_of(TRAINER_KEY))


def _order(url: str, step: int, rules: PoolRules = RULES) -> WorkOrder:
    return WorkOrder(rules=rules, step=step,
                     policy_versions=list(range(max(0, step - 1), step + 1)),
                     shardcast_servers=[url], max_file_bytes=1 << 20, max_units_per_file=10_000)


def test_follow_hot_loads_new_versions_and_validator_fetches_them(tmp_path):
    tok = CharTokenizer()
    dirs = [save_model(build_model("qwen2-tiny", tok.vocab_size, seed=s), tok, tmp_path / f"m{s}")
            for s in (1, 2)]

    async def scenario() -> None:
        origin = Origin(OriginConfig(root=str(tmp_path / "origin"), server=ServerConfig(),
                                     run=RULES.policy_run()), key=TRAINER_KEY)
        url = await origin.start()
        try:
            await origin.publish(dirs[0], 1, shard_size=1 << 20)
            cfg = WorkerConfig(work_dir=str(tmp_path / "w"), engine=EngineConfig(num_threads=1))
            holder = await PolicyHolder.start(cfg, _order(url, 1))
            assert holder.version == 1
            stop = asyncio.Event()
            follow = asyncio.create_task(holder.follow([url], stop))
            a = Assignment(RULES, "0x" + "ab" * 20, 0, 1)
            gen = asyncio.create_task(asyncio.to_thread(holder.generate, a, RULES.task.build(),
                                                        "0x" + "cd" * 20))
            await origin.publish(dirs[1], 2, shard_size=1 << 20)
            for _ in range(2400):  # a loaded machine may take a while
                if holder.version == 2:
                    break
                await asyncio.sleep(0.05)
            first = await gen  # generation went on while version 2 arrived
            assert first.header.policy_version in (1, 2) and holder.version == 2
            fresh = CPUEngine.from_pretrained(dirs[1], EngineConfig(num_threads=1))
            probe = [[1, 20, 30]], [[40, 41, 42]]
            got = holder.engine.score(*probe)[0].logprobs
            assert torch.allclose(got, fresh.score(*probe)[0].logprobs, atol=1e-6)
            stop.set()
            follow.cancel()  # it may sit in a long-poll for the next version
            await asyncio.gather(follow, return_exceptions=True)

            cache = ModelCache(tmp_path / "v", "", [url], EngineConfig(num_threads=1),
                               fetch_timeout=2.0, signer=RULES.policy_signer,
                               run=RULES.policy_run())
            engine = await cache.get(2)
            assert engine is await cache.get(2) and cache.loads == 1
            with pytest.raises(VersionUnavailable, match="policy version 7"):
                await cache.get(7)
        finally:
            await origin.stop()

    asyncio.run(asyncio.wait_for(scenario(), 240))


def test_a_pool_naming_no_policy_signer_is_refused_by_worker_and_validator(tmp_path):
    """No signer: nothing a server sends could be told from a forgery, so neither fetches."""
    unsigned = RULES.model_copy(update={"policy_signer": None})
    cfg = WorkerConfig(work_dir=str(tmp_path / "w"), engine=EngineConfig(num_threads=1))
    refusal = ("refusing to fetch policy versions: the pool's rules name no policy_signer, so "
               "no version can be authenticated")
    with pytest.raises(PoolRulesError) as e:
        asyncio.run(PolicyHolder.start(cfg, _order("http://127.0.0.1:9", 1, unsigned)))
    assert str(e.value) == refusal
    with pytest.raises(PoolRulesError) as e:
        ModelCache(tmp_path / "v", "", ["http://127.0.0.1:9"], EngineConfig(num_threads=1))
    assert str(e.value) == refusal
    ModelCache(tmp_path / "v", "m", [], EngineConfig(num_threads=1))  # a local model: no fetch


@pytest.mark.parametrize(("key", "run"), [("0x" + "66" * 32, "pool-1"), (TRAINER_KEY, "pool-2")],
                         ids=["another_signer", "another_pool"])
def test_worker_and_validator_refuse_a_version_not_signed_by_the_policy_signer(
        tmp_path: Path, key: str, run: str) -> None:
    """An origin serving a version signed by another key (a relay's forgery), or by the policy
    signer for another pool (its run), is never believed: the worker keeps waiting for the
    signer's version of its pool (it never loads the other), the validator's cache finds no such
    version."""
    tok = CharTokenizer()
    model = save_model(build_model("qwen2-tiny", tok.vocab_size, seed=1), tok, tmp_path / "m")

    async def scenario() -> str:
        forger = Origin(OriginConfig(root=str(tmp_path / "forged"), server=ServerConfig(),
                                     run=run), key=key)
        url = await forger.start()
        try:
            await forger.publish(model, 1, shard_size=1 << 20)
            cfg = WorkerConfig(work_dir=str(tmp_path / "w"), engine=EngineConfig(num_threads=1))
            order = _order(url, 1).model_copy(update={"policy_versions": [1]})
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(PolicyHolder.start(cfg, order), 3)
            assert not (tmp_path / "w" / "policy" / "v1").exists()
            cache = ModelCache(tmp_path / "v", "", [url], EngineConfig(num_threads=1),
                               fetch_timeout=1.0, signer=RULES.policy_signer,
                               run=RULES.policy_run())
            with pytest.raises(VersionUnavailable) as validator_err:
                await cache.get(1)
            return str(validator_err.value)
        finally:
            await forger.stop()

    assert asyncio.run(asyncio.wait_for(scenario(), 120)) == (
        "policy version 1: shardcast: version 1 did not appear in time")
