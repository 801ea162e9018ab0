"""A mixed-precision pool through `meshrl network up` (issue #26): one honest worker on the
float32 CPU engine, one on the bfloat16 reference backend, and a cheater that forges rewards
after step 1, under the "any-hardware" profile. No honest file is invalidated (the bfloat16
worker's included) and the cheater is hard-invalidated and slashed."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import netutil as nu
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.anvil]

COMPUTE = '[{ backend = "engine" }, { backend = "reference", dtype = "bfloat16" }]'
CONFIG = nu.short_network(
    "mixed", steps=4, checkpoint_every=2, top="max_minutes = 25",
    workers='honest = 2\ndishonest = 1\ncheat = { mode = "forge-rewards", after_step = 1 }\n'
            f"compute = {COMPUTE}",
).replace("[pool]\n", '[pool]\nproof_profile = "any-hardware"\n')  # network.toml: cpu-engine


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[Path]:
    run = nu.run_network(tmp_path_factory.mktemp("mixed"), CONFIG, "mixed", port_offset=20)
    root, _ = next(run)
    try:
        yield root
    finally:
        run.close()


def test_both_precisions_honest_and_the_cheater_slashed(net) -> None:
    info, chain, ledger = nu.info(net), nu.chain(net), nu.ledger(net)
    assert not [e for e in nu.events(net) if e["event"] == "retired"
                and e["role"] != "cheater-0"]  # a bf16 worker refused by the profile retires
    evs = chain.events().poll()
    invalidated = [e for e in evs if e.name == "WorkInvalidated"]
    for name in ("worker-0", "worker-1"):
        node = info["workers"][name]["node"].lower()
        mine = [e for e in ledger.values() if e.node.lower() == node]
        assert mine and any(e.status.value == "accepted" for e in mine), name
        assert not [e for e in invalidated if e.args["node"].lower() == node], name
    bad = info["workers"]["cheater-0"]["node"].lower()
    hard = [e for e in invalidated if e.args["hard"] and e.args["node"].lower() == bad]
    assert hard and sum(e.args["slashed"] for e in hard) > 0
    worker_1 = tomllib.loads((net / "configs" / "worker-1.toml").read_text())
    assert (worker_1["backend"], worker_1["dtype"]) == ("reference", "bfloat16")
