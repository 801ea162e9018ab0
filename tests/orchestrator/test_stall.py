"""No silent stall: while the pool's step stands still the orchestrator says what it has and
lacks, and a trainer waiting for accepted files or for verdicts says what it awaits."""

from __future__ import annotations

import json
import threading
import time

import pytest

from meshrl.rl.config import NetworkSourceConfig, RolloutConfig
from meshrl.rl.ledger_files import FileGroups
from meshrl.rl.network_source import NetworkSource
from meshrl.wire.models import FileStatus, LedgerEntry

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
                       step=step, policy_version=step, work_units=1, size=1,
                       status=FileStatus.ACCEPTED, verdict="accept", download="/files/x")


def test_trainer_says_what_a_step_awaits(pool: Pool, tmp_path, capsys) -> None:
    key = tmp_path / "trainer.key"
    key.write_text(pool.key("trainer"))
    cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key), poll_s=0.02,
                              stall_log_s=0.1)
    src = NetworkSource(cfg, RolloutConfig(group_size=2, prompts_per_step=64), 1, 0, tmp_path,
                        (None, None))
    arrived = threading.Event()
    src.take = lambda: _entry(3) if arrived.is_set() else None  # nothing accepted for now
    threading.Timer(0.5, arrived.set).start()
    got = src._next_entry(3, [FileGroups(_entry(3), excluded=2)], [])
    assert got.step == 3
    said = _lines(capsys.readouterr().err, "step waiting for accepted files")
    assert said and said[0]["step"] == 3 and said[0]["need"] == 64
    assert said[0]["excluded_groups"] == 2 and "held-out" in said[0]["why"]
