"""A task mix as a pool rule through `meshrl network up` (issue #27): one reasoning-gym dataset,
one dataset on disk (a JSONL file written here, pinned by its sha256) and one code task graded
in the bubblewrap sandbox. One honest worker generates the mix, the validator re-scores every
row, the trainer learns from the accepted files (its steps advance), and three cheaters, each
forging the rewards of one task's rows only (`forge_tasks`), are each hard-invalidated for
their rewards and slashed (a cheater's file that holds no row of its task is honest, and may be
accepted and trained on)."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import netutil as nu
import pytest

from meshrl.protocol import Protocol
from meshrl.rl.network_source import read_records
from meshrl.tasks import TasksConfig
from meshrl.tasks.dataset import data_digest
from meshrl.tasks.sandbox import SandboxConfig, SandboxUnavailable, check_sandbox

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(1200)]

TOKEN = 10**18
STEPS = 3
TASKS = ("rg/chain_sum", "qa", "code")


def _qa_file(path: Path) -> Path:
    """A small arithmetic question set on disk, answers checked by the numeric verifier."""
    rng = random.Random(5)
    rows = []
    for _ in range(60):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": f"{a}+{b}=", "answer": str(a + b)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(qa: Path) -> str:
    mix = (
        '[{ type = "reasoning_gym", dataset = "chain_sum", config = { min_terms = 2, '
        'max_terms = 2, min_digits = 1, max_digits = 1 } }, '
        f'{{ type = "dataset", name = "qa", path = "{qa}", template = "{{question}}", '
        f'verifier = "numeric", sha256 = "{data_digest(qa)}" }}, '
        '{ type = "code" }]')
    forge = ", ".join(f'"{t}"' for t in TASKS)
    return nu.short_network(
        "mix", steps=STEPS, checkpoint_every=100, sft_steps=0, eval_problems=8,
        # one validator: its verdicts final at once (unconfirmed ones would stay open 24
        # dispute periods: the verdict game, docs/protocol.md)
        top="relays = 0\nmax_minutes = 18\n[validators]\ncount = 1\n[chain]\ndispute_period = 0",
        workers=f'honest = 1\ndishonest = 3\n'
                f'cheat = {{ mode = "forge-rewards", after_step = -1 }}\n'
                f'forge_tasks = [{forge}]',
        pool=f"task = {{ mix = {mix} }}", train="filter_groups = false")


def test_a_task_mix_runs_through_the_network_and_each_forgery_is_slashed(tmp_path) -> None:
    try:
        check_sandbox(SandboxConfig())
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox for code tasks: {e}")
    qa = _qa_file(tmp_path / "qa.jsonl")
    # the rule as written builds here: three tasks under the names the cheaters forge
    mix = TasksConfig.model_validate({"mix": [
        {"type": "reasoning_gym", "dataset": "chain_sum"},
        {"type": "dataset", "name": "qa", "path": str(qa), "sha256": data_digest(qa)},
        {"type": "code"}]}).build()
    assert tuple(mix.names) == TASKS
    t0 = time.monotonic()
    run = nu.run_network(tmp_path, _config(qa), "mix", timeout=1000)
    root, proc = next(run)
    try:
        finished_s = time.monotonic() - t0
        info, chain = nu.info(root), nu.chain(root)
        # the trainer learned from accepted files of the mix: every step trained, none stale
        records = read_records(root / "trainer" / "rollouts.jsonl")
        assert [r["step"] for r in records] == list(range(STEPS)), records[-3:]
        honest = info["workers"]["worker-0"]["node"].lower()
        ledger = nu.ledger(root)
        mine = [e for e in ledger.values() if e.node.lower() == honest]
        assert any(e.status.value == "accepted" for e in mine), [e.status for e in mine]
        assert not [e for e in mine if e.status.value.endswith("invalidated")]
        # trained only on accepted files (a cheater's file without a row of its task is honest)
        used = [f["sha256"] for r in records for f in r["used"]]
        assert used and len(used) == len(set(used))
        assert {ledger[s].status.value for s in used} == {"accepted"}

        # each cheater, forging the rewards of one task's rows, is caught on its rewards
        def caught() -> dict[str, list[int]]:
            evs = chain.events().poll()
            out: dict[str, list[int]] = {}
            for j, _ in enumerate(TASKS):
                node = info["workers"][f"cheater-{j}"]["node"].lower()
                out[node] = [e.args["slashed"] for e in evs if e.name == "WorkInvalidated"
                             and e.args["hard"] and e.args["node"].lower() == node]
            return out if all(out.values()) else {}

        slashes = nu.wait(caught, 300, "a cheater was not hard-invalidated", every=3.0)

        def ledgered() -> dict[str, list[Any]]:
            """Each cheater's hard-invalidated files on the ledger, once every one has some
            (the orchestrator follows the chain's events a moment after they are mined)."""
            entries = nu.ledger(root).values()
            out = {}
            for j, _ in enumerate(TASKS):
                node = info["workers"][f"cheater-{j}"]["node"].lower()
                out[node] = [e for e in entries if e.node.lower() == node
                             and e.status.value == "hard_invalidated"]
            return out if all(out.values()) else {}
        on_ledger = nu.wait(ledgered, 60, "a slashed file is not hard-invalidated on the ledger")
        for j, task in enumerate(TASKS):
            w = info["workers"][f"cheater-{j}"]
            node = w["node"].lower()
            bad = on_ledger[node]
            assert all("rewards" in e.verdict_reason for e in bad), (
                task, [(e.verdict, e.verdict_reason) for e in bad])
            slashed = sum(slashes[node])
            assert slashed >= 50 * TOKEN, (task, slashed)
            assert _stake(chain, w["provider"]) == 100 * TOKEN - slashed, task
        # the report judges each cheater on the files its log says it forged: those hold a
        # row of its task, and none of them was trained on
        proc.send_signal(signal.SIGINT)  # the report is written while the roles still answer
        assert proc.wait(400) == 0
        checks = {c["name"]: c for c in json.loads((root / "report.json").read_text())["checks"]}
        for j, task in enumerate(TASKS):
            n = checks[f"cheater_caught[cheater-{j}]"]["numbers"]
            assert n["dishonest_files"] >= 1 and n["dishonest_trained_on"] == 0, (task, n)
            assert n["dishonest_hard_invalidated"] >= 1, (task, n)
        print(json.dumps({"test": "task_mix_e2e", "trainer_finished_s": round(finished_s, 1),
                          "all_caught_s": round(time.monotonic() - t0, 1)}))
    finally:
        run.close()


def _stake(chain: Protocol, provider: str) -> int:
    return int(chain.provider(provider).stake)
