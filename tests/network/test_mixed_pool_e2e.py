"""A mixed-precision pool through `meshrl network up` (issue #26): one worker on the float32 CPU
engine, one on the bfloat16 reference backend (`[[workers.compute]]`), a cheater forging its
rewards, proof profile `any-hardware`. After a warm start (sharper logits than a random policy:
bf16 log-prob noise grows with them), the honest workers of both precisions have files
accepted and none invalidated, the trainer uses only accepted files, and the cheater is
hard-invalidated and slashed. The trainer trains LoRA adapters (issue #28) and broadcasts each
version after the base as its adapter alone: every worker and the validator merge each one to
exactly the weights the trainer stated (the report's `adapter_weights_match`)."""

from __future__ import annotations

import json
import time

import netutil as nu
import pytest

from meshrl.rl.network_source import read_records

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(1500)]

TOKEN = 10**18
STEPS = 6

# one validator: nobody can confirm its verdicts, which then stay open 24 dispute periods
# (docs/protocol.md, the verdict game); this test is not about disputes, so they are final at once
CONFIG = nu.short_network(
    "mixed", steps=STEPS, checkpoint_every=100, sft_steps=60, eval_problems=8,
    top="relays = 0\nmax_minutes = 20\n[validators]\ncount = 1\n[chain]\ndispute_period = 0",
    workers='honest = 2\ndishonest = 1\ncheat = { mode = "forge-rewards", after_step = -1 }\n'
            '[[workers.compute]]\nbackend = "engine"\ndtype = "float32"\n'
            '[[workers.compute]]\nbackend = "reference"\ndtype = "bfloat16"',
    pool='proof_profile = "any-hardware"',
    train='lora = { enabled = true, rank = 4 }\nnetwork = { broadcast = "adapter" }')


def test_float32_and_bfloat16_workers_are_both_paid_and_the_cheater_slashed(tmp_path) -> None:
    t0 = time.monotonic()
    run = nu.run_network(tmp_path, CONFIG, "mixed", timeout=1200)
    root, _ = next(run)
    try:
        finished_s = time.monotonic() - t0
        info, chain = nu.info(root), nu.chain(root)
        records = read_records(root / "trainer" / "rollouts.jsonl")
        assert [r["step"] for r in records] == list(range(STEPS)), records[-3:]
        ledger = nu.ledger(root)
        counts = {}
        for name in ("worker-0", "worker-1"):  # fp32 CPU engine, bf16 reference backend
            node = info["workers"][name]["node"].lower()
            mine = [e for e in ledger.values() if e.node.lower() == node]
            bad = [(e.status.value, e.verdict) for e in mine
                   if e.status.value.endswith("invalidated")]
            assert not bad, (name, bad)
            counts[name] = sum(e.status.value == "accepted" for e in mine)
            assert counts[name] > 0, (name, [e.status for e in mine])
        used = [f["sha256"] for r in records for f in r["used"]]
        assert used and {ledger[s].status.value for s in used} == {"accepted"}
        cheat = info["workers"]["cheater-0"]

        def slashed() -> int:
            node = cheat["node"].lower()
            return sum(e.args["slashed"] for e in chain.events().poll()
                       if e.name == "WorkInvalidated" and e.args["hard"]
                       and e.args["node"].lower() == node)

        from meshrl.network.report import _adapter_weights  # the report's check reads these

        weights = _adapter_weights(root)
        assert len(weights) >= STEPS - 1 and all("trainer" in w for w in weights.values())
        roles = {r for w in weights.values() for r in w} - {"trainer"}
        assert {"worker-0", "worker-1", "validator"} <= roles, weights
        mismatched = [(v, r) for v, w in weights.items() for r, h in w.items()
                      if r != "trainer" and h != w["trainer"]]
        assert not mismatched, mismatched
        total = nu.wait(slashed, 300, "the cheater was not hard-invalidated", every=3.0)
        assert total >= 50 * TOKEN
        print(json.dumps({"test": "mixed_pool_e2e", "trainer_finished_s": round(finished_s, 1),
                          "accepted": counts, "cheater_slashed": total / TOKEN}))
    finally:
        run.close()
