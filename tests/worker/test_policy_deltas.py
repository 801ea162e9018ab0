"""Delta broadcast end to end: the trainer publishes each later version as a delta; a worker
following the origin and a validator fetching versions rebuild them on the versions they hold,
and compute with weights whose hash is the trainer's, version after version."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from helpers import TASKS

from meshrl.inference import EngineConfig
from meshrl.model import CharTokenizer, build_model, load_model
from meshrl.pool import PoolRules, WorkOrder
from meshrl.rl.network_source import ShardcastPublisher
from meshrl.shardcast import Origin, OriginConfig
from meshrl.shardcast.config import ServerConfig
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


def _weights_hash(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("dtype, lr", [("float32", 3e-4), ("bfloat16", 1e-6)])
def test_worker_and_validator_compute_with_the_trainers_weights_for_every_delta(tmp_path,
                                                                                caplog, dtype,
                                                                                lr):
    """bfloat16: the trainer's weights are its float32 master rounded (what it publishes and
    its own rollouts use), the deltas sparse value deltas."""
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    pub = ShardcastPublisher(tmp_path / "origin", _Step(), model, tok, KEY,  # type: ignore[arg-type]
                             run=RULES.policy_run(), broadcast="delta", dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    trainer_hash: dict[int, str] = {}

    def train_and_publish(version: int) -> None:
        if version > 1:  # one real optimizer step between versions
            ids = torch.randint(0, tok.vocab_size, (2, 16))
            model.train()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            model.eval()
        pub.publish(version, model.state_dict())
        state = model.state_dict()
        if dtype == "bfloat16":
            state = {k: v.to(torch.bfloat16).float() for k, v in state.items()}
        trainer_hash[version] = _weights_hash(state)

    async def scenario() -> None:
        origin = Origin(OriginConfig(root=str(tmp_path / "origin"),
                                     server=ServerConfig(scan_interval=0.05),
                                     run=RULES.policy_run()), key=KEY)
        url = await origin.start()
        try:
            train_and_publish(1)
            await asyncio.sleep(0.2)
            order = WorkOrder(rules=RULES, step=1, policy_versions=[0, 1],
                              shardcast_servers=[url], max_file_bytes=1 << 20,
                              max_units_per_file=10_000)
            cfg = WorkerConfig(work_dir=str(tmp_path / "w"), engine=EngineConfig(num_threads=1))
            holder = await PolicyHolder.start(cfg, order)
            stop = asyncio.Event()
            follow = asyncio.create_task(holder.follow([url], stop))
            cache = ModelCache(tmp_path / "v", "", [url], EngineConfig(num_threads=1),
                               fetch_timeout=20.0, signer=RULES.policy_signer,
                               run=RULES.policy_run())
            policy = tmp_path / "w" / "policy"
            for v in (1, 2, 3):
                if v > 1:
                    train_and_publish(v)
                for _ in range(2400):
                    if holder.version == v:
                        break
                    await asyncio.sleep(0.05)
                assert holder.version == v
                await cache.get(v)
                worker = _weights_hash(load_model(policy / f"v{v}").state_dict())
                validator = _weights_hash(load_model(tmp_path / "v" / "policy" / f"v{v}")
                                          .state_dict())
                assert worker == validator == trainer_hash[v], v
            stop.set()
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        finally:
            await origin.stop()

    with caplog.at_level(logging.INFO, logger="meshrl.shardcast.client"):
        asyncio.run(asyncio.wait_for(scenario(), 240))
    fetched = sorted((r.fields["version"], r.fields["payload"]) for r in caplog.records
                     if r.getMessage() == "fetched")
    if dtype == "bfloat16":  # the sparse codec made them
        from meshrl.shardcast.sparse import MAGIC

        for v in (2, 3):
            delta = tmp_path / "origin" / f"v{v}" / "data" / "delta" / "model.safetensors.xorz"
            assert delta.read_bytes()[:10] == MAGIC
    # versions 2 and 3 arrived as deltas at both the worker and the validator
    assert fetched == [(1, "full"), (1, "full"), (2, "delta"), (2, "delta"), (3, "delta"),
                       (3, "delta")]
