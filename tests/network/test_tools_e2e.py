"""Agentic episodes through `meshrl network up` (issue #45), shortened: the pool of
configs/network_tools.toml (4-digit multiplication answered with the `calc` tool), the trainer
warm-started on tool-use traces until its policy writes calls, one honest worker and one lying
calculator (`forge-tools`: every tool output it appends is off by one, the model's later turns
its real samples), one validator that re-runs every tool output. The honest worker's episode
files (tool outputs in them) are accepted, none invalidated, and only accepted files trained
on; the liar is hard-invalidated for its episodes and slashed; the report's checks pass.

A module of its own, not a task of test_task_mix_e2e's network: a random policy never writes
a call (nothing to forge or re-run), so this pool needs a warm start and 64-token episodes,
which that module's pool (no warm start, 8 tokens) would pay on every task."""

from __future__ import annotations

import json
import signal
import time
import tomllib

import netutil as nu
import pytest

from meshrl.rl.network_source import read_records
from meshrl.wire.rollout_file import read_rollout_file, segments

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(1200)]

TOKEN = 10**18
STEPS = 2
SHIPPED = tomllib.loads((nu.ROOT / "configs" / "network_tools.toml").read_text())


def _config() -> str:
    pool = SHIPPED["pool"]
    ep = pool["task"]["mix"][0]["episode"]
    mix = (f'[{{ type = "tool_arithmetic", digits = 4, operators = "*", episode = {{ '
           f'max_turns = {ep["max_turns"]}, max_tool_tokens = {ep["max_tool_tokens"]} }} }}]')
    return nu.short_network(
        # 60 warm-start steps: the policy writes a call in most episodes (at 20, in none)
        "tools", steps=STEPS, checkpoint_every=100, sft_steps=60, eval_problems=8,
        # one validator: its verdicts final at once (docs/protocol.md, the verdict game)
        top=f'train_config = "{SHIPPED["train_config"]}"\nrelays = 0\nmax_minutes = 18\n'
            "[validators]\ncount = 1\n[chain]\ndispute_period = 0",
        workers='honest = 1\ndishonest = 1\ncheat = { mode = "forge-tools", after_step = -1 }',
        pool=f"task = {{ mix = {mix} }}\nmax_new_tokens = {pool['max_new_tokens']}\n"
             f"temperature = {pool['temperature']}")


def test_tool_episodes_run_through_the_network_and_the_lying_tool_is_slashed(tmp_path) -> None:
    t0 = time.monotonic()
    run = nu.run_network(tmp_path, _config(), "tools", timeout=1000)
    root, proc = next(run)
    try:
        finished_s = time.monotonic() - t0
        info, chain = nu.info(root), nu.chain(root)
        records = read_records(root / "trainer" / "rollouts.jsonl")
        assert [r["step"] for r in records] == list(range(STEPS)), records[-3:]
        ledger = nu.ledger(root)
        honest = info["workers"]["worker-0"]["node"].lower()
        mine = [e for e in ledger.values() if e.node.lower() == honest]
        assert not [(e.status.value, e.verdict) for e in mine
                    if e.status.value.endswith("invalidated")]
        accepted = {e.sha256 for e in mine if e.status.value == "accepted"}
        assert accepted, [e.status for e in mine]
        # the accepted honest files hold episodes: tool outputs the validator re-ran
        sent = {p.stem: p for p in (root / "workers" / "worker-0").rglob("*.parquet")}
        calls = sum(len([s for s in segments(c) if not s.model])
                    for sha in accepted & sent.keys()
                    for c in read_rollout_file(sent[sha].read_bytes()).completions)
        assert calls > 0, sorted(sent)
        used = [f["sha256"] for r in records for f in r["used"]]
        assert used and {ledger[s].status.value for s in used} == {"accepted"}

        liar = info["workers"]["cheater-0"]

        def slashed() -> list[int]:
            node = liar["node"].lower()
            return [e.args["slashed"] for e in chain.events().poll()
                    if e.name == "WorkInvalidated" and e.args["hard"]
                    and e.args["node"].lower() == node]

        total = sum(nu.wait(slashed, 300, "the lying tool was not hard-invalidated", every=3.0))
        assert total >= 50 * TOKEN

        def ledgered() -> list[str]:
            return [e.verdict_reason for e in nu.ledger(root).values()
                    if e.node.lower() == liar["node"].lower()
                    and e.status.value == "hard_invalidated"]
        verdicts = nu.wait(ledgered, 60, "no hard-invalidated file of the liar on the ledger")
        assert all("episode" in v for v in verdicts), verdicts
        proc.send_signal(signal.SIGINT)  # the report is written while the roles still answer
        assert proc.wait(400) == 0
        checks = json.loads((root / "report.json").read_text())["checks"]
        assert all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
        n = next(c for c in checks if c["name"] == "cheater_caught[cheater-0]")["numbers"]
        assert n["dishonest_files"] >= 1 and n["dishonest_trained_on"] == 0, n
        print(json.dumps({"test": "tools_e2e", "trainer_finished_s": round(finished_s, 1),
                          "honest_tool_outputs": calls, "liar_slashed": total / TOKEN,
                          "all_caught_s": round(time.monotonic() - t0, 1)}))
    finally:
        run.close()
