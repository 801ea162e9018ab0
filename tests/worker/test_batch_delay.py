"""A partial batch goes out when its oldest file has waited the pool's `batch.max_delay_s`,
also while its worker waits on the pool's long poll for its next order (issue 46: measured on
`meshrl network up` with configs/batched.toml, files waited ~6 s for a 2 s rule, and the
trainer with them). Real processes: anvil, discovery, an orchestrator that holds work orders
up to 30 s, and `meshrl worker`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from meshrl.wire import SignedClient
from meshrl.wire.models import StepUpdate
from network import RULES, fund_provider, key, start_net, wait_until, worker

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

DELAY = 1.0


def _first_batch_after_written(tmp_path: Path, delay: float, ahead: int | None) -> float:
    """Seconds from a worker's first file written to its first `BatchSubmitted`, in a pool
    batching 4 files with `delay`; `ahead`: the trainer's demand (None: no pacing)."""
    rules = {**RULES, "batch": {"files": 4, "max_delay_s": delay}}
    work = {"step": 0, "max_units_per_file": 100_000, "slot_ttl_s": 20.0, "max_hold_s": 30.0}
    net = start_net(tmp_path, orch={"rules": rules, "work": work})
    try:
        if ahead is not None:
            async def pace() -> None:
                async with SignedClient(net.orch.url, "0x" + bytes(key("mgr").key).hex()) as c:
                    await c.call("POST", "/step", StepUpdate(step=0, ahead=ahead))
            asyncio.run(pace())
        _, node, _ = fund_provider(net, "slow")
        w = worker(net, "slow", max_files=4, work_wait_s=30.0)
        w.start()

        def written() -> float | None:
            for line in w.log.read_text().splitlines() if w.log.exists() else []:
                if '"file written"' in line:
                    return json.loads(line)["ts"]
            return None
        at = wait_until(written, 240)

        def sent() -> bool:
            return any(e.name == "BatchSubmitted" and e.args["node"] == node.address
                       for e in net.fed.events(net.fed.deployment.block).poll())
        wait_until(sent, delay + 25)
        return time.time() - at
    finally:
        net.close()


def test_a_partial_batch_goes_out_at_its_delay_while_the_worker_waits_for_work(tmp_path):
    # the trainer wants one file ahead: the worker makes one, then its order is held; without
    # the timer the batch went out when the held order came back (10 s in, measured)
    took = _first_batch_after_written(tmp_path, DELAY, ahead=1)
    assert took < DELAY + 4, took


def test_a_partial_batch_goes_at_once_when_the_pool_wants_no_other_file_now(tmp_path):
    """The pool paces (one file ahead) and has this node's file: no other file can join the
    batch before the pool wants one, so waiting out the delay only delays the trainer. The
    worker's quick look at its next order (not held) sends the partial batch at once; it
    waited the whole delay before (measured: 20.1 s for a 20 s delay; 0.19 s now)."""
    took = _first_batch_after_written(tmp_path, 20.0, ahead=1)
    assert took < 8, took
