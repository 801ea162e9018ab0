"""The trainer's `LedgerReader.set_step` against the orchestrator's API on loopback (served from
its parts): the pool moves forward, and a step behind the pool's (a resumed run) is refused as
`StepGoesBack`, which the reader takes as "already past it"; any other refusal is raised."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.rl.ledger_files import LedgerReader
from meshrl.wire import NotAReader, TakenBeyondAccepted
from meshrl.wire.models import FileStatus
from orchestrator.parts import Served, address, api_from_parts, key  # tests/ is on sys.path


@contextmanager
def served(tmp: Path) -> Iterator[Served]:
    """The API on its own event loop in a thread (the reader runs `asyncio.run` itself)."""
    ready, stop, box = threading.Event(), threading.Event(), {}

    async def serve() -> None:
        cfg = OrchestratorConfig(pool_id=1, work={"step": 5})
        async with api_from_parts(tmp, cfg, readers=(address("trainer"),)) as s:
            box["s"] = s
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield box["s"]
    finally:
        stop.set()
        thread.join(10)


def test_set_step_moves_forward_and_takes_a_step_behind_as_done(tmp_path: Path) -> None:
    with served(tmp_path) as s:
        reader = LedgerReader(s.url, key("trainer"))
        assert reader.set_step(7) == 7
        assert reader.set_step(6) == 6  # the pool is at 7 already: nothing to do
        assert s.api.pool.step == 7
        with pytest.raises(NotAReader):  # not a step refusal: raised
            LedgerReader(s.url, key("n1")).set_step(9)
        assert s.api.pool.step == 7


def test_set_step_restates_the_trainers_demand(tmp_path: Path) -> None:
    """The pacing demand reaches the orchestrator with the move, and a move without one stops
    pacing (work orders then want no particular number of files)."""
    with served(tmp_path) as s:
        for i in range(3):  # three accepted files: the demand may name acceptance 3, no more
            sha = f"{i:064x}"
            s.state.grant_slot(f"slot{i}", address("n1"), address("p1"), sha, 10, 5, 1, i,
                               time.time() + 60)
            row = s.state.file(sha)
            assert row is not None
            s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
        reader = LedgerReader(s.url, key("trainer"))
        with pytest.raises(TakenBeyondAccepted):
            reader.set_step(5, taken_through=4, ahead=8)
        assert s.api.pacer.demand is None
        assert reader.set_step(5, taken_through=3, ahead=8) == 5
        demand = s.api.pacer.demand
        assert demand is not None and (demand.taken_through, demand.ahead) == (3, 8)
        reader.set_step(6, taken_through=1, ahead=8)  # never goes back (a resumed trainer)
        assert s.api.pacer.demand is not None and s.api.pacer.demand.taken_through == 3
        reader.set_step(6)
        assert s.api.pacer.demand is None
