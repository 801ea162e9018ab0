"""Adapter broadcast end to end: a LoRA trainer publishes its base once, then each version as
its adapter alone; a worker following the origin and a validator fetching versions merge each
onto the base they hold, and compute with weights whose hash is the trainer's, version after
version."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from helpers import TASKS

from meshrl.inference import EngineConfig
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRules, WorkOrder
from meshrl.rl.config import LoraConfig
from meshrl.rl.lora import LoraPolicy
from meshrl.rl.network_source import ShardcastPublisher
from meshrl.shardcast import Origin, OriginConfig
from meshrl.shardcast.adapter import read_weights, weights_sha256
from meshrl.shardcast.config import ServerConfig
from meshrl.shardcast.store import VersionStore
from meshrl.validator.models import ModelCache
from meshrl.wire.signing import address_of
from meshrl.worker.config import WorkerConfig
from meshrl.worker.policy import PolicyHolder

KEY = "0x" + "7e" * 32
RULES = PoolRules(pool_id=1, async_level=1, task=TASKS, sampling={"max_new_tokens": 8},
                  group_size=2, seed=3, prompts_per_file=2, policy_signer=address_of(KEY))


class _Step:
    """The orchestrator's step as the publisher moves it (no pool in this test)."""

    def set_step(self, step: int, taken_through: int | None = None,
                 ahead: int | None = None) -> int:
        return step


def _held_hash(model_dir: Path) -> str:
    return weights_sha256({k: v for f in read_weights(model_dir).values() for k, v in f.items()})


@pytest.mark.slow
def test_worker_and_validator_compute_with_the_trainers_weights_for_every_adapter(tmp_path,
                                                                                  caplog):
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    save_model(model, tok, tmp_path / "base")
    lora = LoraPolicy(model, tmp_path / "base", LoraConfig(enabled=True, rank=4, alpha=8.0))
    pub = ShardcastPublisher(tmp_path / "origin", _Step(), lora.model, tok, KEY,  # type: ignore[arg-type]
                             run=RULES.policy_run(), broadcast="adapter", lora=lora)
    opt = torch.optim.AdamW([p for p in lora.model.parameters() if p.requires_grad], lr=1e-2)
    trainer_hash: dict[int, str] = {}

    def train_and_publish(version: int) -> None:
        if version > 0:  # one real optimizer step of the adapters between versions
            ids = torch.randint(0, tok.vocab_size, (2, 16))
            lora.model.train()
            lora.model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            lora.model.eval()
        pub.publish(version, lora.effective_state())
        trainer_hash[version] = lora.effective_sha256() if version else _held_hash(lora.base_dir)

    async def scenario() -> None:
        origin = Origin(OriginConfig(root=str(tmp_path / "origin"),
                                     server=ServerConfig(scan_interval=0.05),
                                     run=RULES.policy_run()), key=KEY)
        url = await origin.start()
        try:
            train_and_publish(0)
            train_and_publish(1)
            await asyncio.sleep(0.2)
            order = WorkOrder(rules=RULES, step=1, policy_versions=[0, 1],
                              shardcast_servers=[url], max_file_bytes=1 << 20,
                              max_units_per_file=10_000)
            cfg = WorkerConfig(work_dir=str(tmp_path / "w"), engine=EngineConfig(num_threads=1))
            holder = await PolicyHolder.start(cfg, order)  # v1 with no base held: both come
            stop = asyncio.Event()
            follow = asyncio.create_task(holder.follow([url], stop))
            cache = ModelCache(tmp_path / "v", "", [url], EngineConfig(num_threads=1),
                               fetch_timeout=20.0, signer=RULES.policy_signer,
                               run=RULES.policy_run())
            policy = tmp_path / "w" / "policy"
            for v in (1, 2, 3, 4):
                if v > 1:
                    train_and_publish(v)
                for _ in range(2400):
                    if holder.version == v:
                        break
                    await asyncio.sleep(0.05)
                assert holder.version == v
                await cache.get(v)
                worker = _held_hash(policy / f"v{v}")
                validator = _held_hash(tmp_path / "v" / "policy" / f"v{v}")
                assert worker == validator == trainer_hash[v], v
            assert (policy / "v0").is_dir()  # the base is kept while adapters need it
            stop.set()
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        finally:
            await origin.stop()

    with caplog.at_level(logging.INFO, logger="meshrl.shardcast.client"):
        asyncio.run(asyncio.wait_for(scenario(), 240))
    fetched = sorted((r.fields["version"], r.fields["payload"], r.fields["fetched_bytes"])
                     for r in caplog.records if r.getMessage() == "fetched")
    store = VersionStore(tmp_path / "origin")
    full = store.manifest(0).total_size
    assert [(v, p) for v, p, _ in fetched] == [(v, "adapter") for v in (1, 1, 2, 2, 3, 3, 4, 4)]
    # the first fetch of each role brought the base; every later one the adapter alone
    assert fetched[0][2] > full and fetched[1][2] > full
    assert all(b < 0.2 * full for _, _, b in fetched[2:])
    assert [store.manifest(v).payload for v in range(5)] == ["full"] + ["adapter"] * 4
