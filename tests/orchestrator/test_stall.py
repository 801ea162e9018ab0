"""No silent stall: while the pool's step stands still the orchestrator says what it has and
lacks, and a trainer waiting for accepted files or for verdicts says what it awaits."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from meshrl.rl.config import NetworkSourceConfig, RolloutConfig
from meshrl.rl.ledger_files import FileGroups
from meshrl.rl.network_source import NetworkSource, default_ahead
from meshrl.rl.rollouts import RolloutBatch
from meshrl.tasks import Problem
from meshrl.wire.models import FileStatus, LedgerEntry, VerdictKind

from .conftest import Pool

pytestmark = pytest.mark.anvil


def _lines(text: str, msg: str) -> list[dict]:
    out = []
    for x in text.splitlines():
        if x.startswith("{") and msg in x:
            out.append(json.loads(x))
    return out


def test_orchestrator_says_why_the_step_waits(pool: Pool) -> None:
    deadline = time.monotonic() + 20
    while not (said := _lines(pool.orch.log.read_text(), "pool step waiting")):
        assert time.monotonic() < deadline, "no 'pool step waiting' line"
        time.sleep(0.3)
    line = said[-1]
    # the shared pool's members are whoever has joined so far (its tests run in any order)
    assert line["step"] == 3 and line["members"] >= 1 and line["why"]
    assert isinstance(line["files"], dict) and "still_s" in line


def _entry(step: int) -> LedgerEntry:
    return LedgerEntry(seq=1, sha256="ab" * 32, node="0x" + "11" * 20, provider="0x" + "22" * 20,
                       policy_version=step, work_units=1, size=1,
                       status=FileStatus.ACCEPTED, verdict=VerdictKind.ACCEPT,
                       download="/files/x")


def _rows(version: int, groups: int) -> RolloutBatch:
    """A file's `groups` groups of two one-token rows (rewards 1 and 0)."""
    rewards = torch.tensor([[1.0, 0.0]] * groups)
    return RolloutBatch(version, version, [Problem("t", "p", "a")] * groups,
                        [[1]] * 2 * groups, [[2]] * 2 * groups, [[-1.0]] * 2 * groups,
                        rewards, rewards.clone(), 0, 0.0, [[True]] * 2 * groups)


def test_trainer_says_what_a_step_awaits(pool: Pool, tmp_path, capsys) -> None:
    key = tmp_path / "trainer.key"
    key.write_text(pool.key("trainer"))
    cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key), poll_s=0.02,
                              stall_log_s=0.1)
    src = NetworkSource(cfg, RolloutConfig(group_size=2, prompts_per_step=64), 1, 0, tmp_path,
                        (None, None))
    arrived = threading.Event()
    src.take = lambda wait_s=0.0: _entry(3) if arrived.is_set() else None  # none accepted yet
    threading.Timer(0.5, arrived.set).start()
    (got,) = src._fresh(3, 1, [FileGroups(_entry(3), _rows(3, 0), excluded=2)], [],
                        wait=True)
    assert got.policy_version == 3
    said = _lines(capsys.readouterr().err, "step waiting for accepted files")
    assert said and said[0]["step"] == 3 and said[0]["need"] == 64
    assert said[0]["excluded_groups"] == 2 and "held-out" in said[0]["why"]


def _health(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())["info"]


def test_trainer_paces_the_pool_by_what_it_will_take(pool: Pool, tmp_path) -> None:
    """`ahead_files`: by default async_level batches' worth of files (here 1 x 64 prompts / 8
    per file), at most 2 batches (a public pool's wide slack is no queue), a number as given,
    0 no pacing; the demand goes out with each move and again
    while a step waits once it took files, and the pool's stall line names it."""
    key = tmp_path / "trainer.key"
    key.write_text(pool.key("trainer"))
    rollout = RolloutConfig(group_size=2, prompts_per_step=64)

    def source(ahead: int) -> NetworkSource:
        cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key),
                                  poll_s=0.02, stall_log_s=0.1, ahead_files=ahead)
        return NetworkSource(cfg, rollout, 1, 0, tmp_path, (None, None))

    assert source(0).ahead is None and source(3).ahead == 3
    assert [default_ahead(a, 8) for a in (0, 1, 2, 24)] == [8, 8, 16, 16]
    src = source(-1)
    assert src.ahead == 8
    try:
        src.reader.set_step(3, src.taken_through, src.ahead)
        assert _health(pool.orch.url)["pacing"]["ahead"] == 8
        # it took files while the step waits: said at once (no further than the pool's last
        # acceptance number, which the orchestrator refuses to pass)
        taken = max((e.accepted_seq for e in src.reader.accepted()), default=0)
        src.taken_through = taken
        src._restate_demand(3)
        assert src._said == (3, taken)
        assert _health(pool.orch.url)["pacing"]["taken_through"] == taken
        deadline = time.monotonic() + 20
        while not [x for x in _lines(pool.orch.log.read_text(), "pool step waiting")
                   if "pacing" in x["why"]]:
            assert time.monotonic() < deadline, "the stall line does not name the pacing"
            time.sleep(0.3)
    finally:
        src.reader.set_step(3)  # the module's other tests see an unpaced pool
    assert _health(pool.orch.url)["pacing"]["ahead"] is None


def test_a_step_loads_its_files_together_and_the_next_ones_while_it_trains(
        pool: Pool, tmp_path) -> None:
    """The trainer's reading: the files a step needs that are accepted now load as one group
    (at most the files it would take one by one: each holds <= prompts_per_file groups), a
    stale one on the way is dropped and recorded, and when the batch is full the files fresh
    for the next step start loading before it is asked for; every file is used once, in
    acceptance order."""
    key = tmp_path / "trainer.key"
    key.write_text(pool.key("trainer"))
    cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key), poll_s=0.02,
                              judge_lag=None, ahead_files=0, load_threads=3)
    src = NetworkSource(cfg, RolloutConfig(group_size=2, prompts_per_step=64), 1, 0, tmp_path,
                        (None, None))
    assert src._loads._max_workers == 3  # groups of files loading at once
    ppf = src.rules.prompts_per_file
    per_step = -(-64 // ppf)
    versions = [3] * per_step + [1] + [3] * (2 * per_step)  # one stale file of version 1
    entries = [_entry(v).model_copy(update={"sha256": f"{i:064x}", "accepted_seq": i + 1})
               for i, v in enumerate(versions)]
    arrived = list(entries)
    src.take = lambda wait_s=0.0: arrived.pop(0) if arrived else None
    groups: list[list[str]] = []

    def load(es: list[LedgerEntry]) -> list[FileGroups]:
        groups.append([e.sha256 for e in es])
        return [FileGroups(e, _rows(e.policy_version, ppf)) for e in es]
    src._load = load
    first = src.get(3)
    assert first.rewards.shape == (per_step * ppf, 2)
    # one group of the files this step needed; then the next step's, taken before it asks
    assert groups[0] == [e.sha256 for e in entries[:per_step]]
    assert src._next_step == 4 and len(src._next) == per_step
    src._next[0][1].result()  # loading in the background: wait for it
    assert groups[1] == [e.sha256 for e in entries[per_step + 1:2 * per_step + 1]]
    second = src.get(4)
    assert second.rewards.shape == (per_step * ppf, 2)
    lines = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    used = [f["sha256"] for r in lines for f in r["used"]]
    assert used == [e.sha256 for e in entries[:per_step] + entries[per_step + 1:3 * per_step]
                    ][:2 * per_step]
    assert [d["reason"] for d in lines[1]["dropped"]] == ["stale"]
    assert len(set(used)) == len(used)
    # the files left are of version 3, stale at step 5 (async_level 1): dropped as the next
    # step's prefetch takes them, and recorded with that step
    assert src._next == [] and len(src._next_dropped) == per_step
    assert src.dropped_stale == 1 + per_step
    src.close()
