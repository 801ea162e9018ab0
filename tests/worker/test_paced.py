"""A paced worker: a work order that wants no file (`files_wanted = 0`) makes none and takes
no counter, one that wants a file gets it made; while paced the worker asks less often (its
wait doubles up to 4x `poll_interval`), and at the pool's first want it asks at once again."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from helpers import TASKS

from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRules, WorkOrder
from meshrl.worker.config import WorkerConfig
from meshrl.worker.keys import WorkerKeys, dev_account
from meshrl.worker.node import WorkerNode
from meshrl.worker.policy import PolicyHolder

RULES = PoolRules(pool_id=1, async_level=1, task=TASKS, sampling={"max_new_tokens": 4},
                  group_size=2, seed=3, prompts_per_file=2, files_per_step=4)


def _order(wanted: int | None) -> WorkOrder:
    return WorkOrder(rules=RULES, step=2, policy_versions=[1, 2], shardcast_servers=[],
                     max_file_bytes=1 << 20, max_units_per_file=10_000, files_wanted=wanted,
                     waiting="" if wanted else "the trainer's demand is met")


def test_a_paced_worker_makes_only_what_the_pool_wants(tmp_path: Path) -> None:
    tok = CharTokenizer()
    save_model(build_model("qwen2-tiny", tok.vocab_size, seed=0), tok, tmp_path / "model")
    cfg = WorkerConfig(work_dir=str(tmp_path / "work"), poll_interval=0.25)
    node = WorkerNode(cfg, WorkerKeys(dev_account(1), dev_account(2)))
    node.rules, node.tasks = RULES, RULES.task.build()
    node.policy = PolicyHolder(cfg, tmp_path / "model", 2)

    assert asyncio.run(node._make_file(_order(0))) is None
    assert node.state == "paced" and not (tmp_path / "work" / "counters.json").exists()
    made = asyncio.run(node._make_file(_order(1)))
    assert made is not None and node.state == "working"
    entry, data = made
    assert (entry.counter, entry.policy_version) == (0, 2) and data
    assert json.loads((tmp_path / "work" / "counters.json").read_text()) == {"2": 1}
    assert asyncio.run(node._make_file(_order(None))) is not None  # not paced: its counters

    waits = [node._idle_wait(_order(0)) for _ in range(4)]
    assert waits == [0.25, 0.5, 1.0, 1.0]
    assert node._idle_wait(_order(1)) == 0.25 and node._idle_wait(_order(0)) == 0.25


def test_an_idle_worker_asks_again_as_soon_as_a_new_version_is_loaded(tmp_path: Path) -> None:
    """A work order answered at once with no file (this node must fetch a newer version, or
    the pool does not hold orders) is waited out by `_idle`: up to the idle wait, but ended by
    the next hot-load of the policy, or by stop."""
    import time

    tok = CharTokenizer()
    save_model(build_model("qwen2-tiny", tok.vocab_size, seed=0), tok, tmp_path / "model")
    cfg = WorkerConfig(work_dir=str(tmp_path / "work"), poll_interval=0.25)
    node = WorkerNode(cfg, WorkerKeys(dev_account(1), dev_account(2)))
    node.policy = PolicyHolder(cfg, tmp_path / "model", 2)

    async def idle_until(wake: str | None) -> float:
        node.stop.clear()
        node.policy.loaded.clear()
        t0 = time.monotonic()

        async def later() -> None:
            await asyncio.sleep(0.2)
            if wake == "loaded":
                node.policy.loaded.set()
            elif wake == "stop":
                node.stop.set()
        waker = asyncio.create_task(later())
        await node._idle(3.0 if wake else 0.4)
        await waker
        return time.monotonic() - t0

    async def cases() -> list[float]:  # one event loop: the node's events belong to it
        return [await idle_until(wake) for wake in ("loaded", "stop", None)]

    loaded, stopped, timed_out = asyncio.run(cases())
    assert 0.15 <= loaded < 1.0 and 0.15 <= stopped < 1.0 and 0.35 <= timed_out < 1.5
