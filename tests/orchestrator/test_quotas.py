"""One node cannot fill the orchestrator's disk or its tables at the request rate: it is
granted one file per (version, counter), counters 0 .. files_per_step - 1 at the versions the
pool accepts now, asking again for one of its files replaces that file's slot, and nothing but
bytes framed as Parquet is ever stored. Over the real HTTP API, served from its parts."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.wire import (
    CounterOutOfRange,
    CounterUsed,
    NotARolloutFile,
    SignedClient,
    StaleWork,
)
from meshrl.wire.models import NodeState, SlotRequest, UploadSlot

from .conftest import parquet_framed
from .parts import address, api_from_parts, key

FILES_PER_STEP, ASYNC = 3, 1  # at step 3: versions 2 and 3, counters 0..2


def _req(data: bytes, version: int, counter: int) -> SlotRequest:
    return SlotRequest(sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                       policy_version=version, work_units=10, counter=counter)


def test_a_flood_of_slot_requests_is_bounded_by_the_counters(tmp_path: Path) -> None:
    cfg = OrchestratorConfig(pool_id=1, work={"step": 3, "max_file_bytes": 4000},
                             rules={"async_level": ASYNC, "files_per_step": FILES_PER_STEP},
                             # the rate limit bounds a flood too: off here, to see the counters
                             guard={"rate_per_minute": 100_000, "rate_burst": 1000})

    async def t() -> None:
        async with api_from_parts(tmp_path, cfg) as s:
            s.state.upsert_node(address("n1"), address("p1"), NodeState.HEALTHY, time.time())
            async with SignedClient(s.url, key("n1")) as c:
                # bytes that are not a rollout file are never stored (the slot stays free)
                junk = os.urandom(300)
                (tmp_path / "junk").write_bytes(junk)
                slot = await c.call("POST", "/uploads", _req(junk, 3, 2), response=UploadSlot)
                with pytest.raises(NotARolloutFile):
                    await c.upload("PUT", slot.url, tmp_path / "junk",
                                   hashlib.sha256(junk).hexdigest())
                assert not list((tmp_path / "files").rglob("*.parquet"))
                assert not any((tmp_path / "files" / "tmp").iterdir())
                granted, refused = [], {}
                for i in range(200):  # 200 distinct files at every counter and version asked
                    data = parquet_framed(os.urandom(100) + i.to_bytes(2, "big"))
                    version, counter = 2 + i % 3, i % 5  # version 4 is not accepted yet
                    try:
                        granted.append(await c.call("POST", "/uploads",
                                                    _req(data, version, counter),
                                                    response=UploadSlot))
                    except (CounterUsed, CounterOutOfRange, StaleWork) as e:
                        refused[type(e).__name__] = refused.get(type(e).__name__, 0) + 1
                # one file per (version, counter) of the window, whatever was asked (the junk
                # file holds version 3's counter 2)
                assert len(granted) == FILES_PER_STEP * (ASYNC + 1) - 1
                assert set(refused) == {"CounterUsed", "CounterOutOfRange", "StaleWork"}
                db = s.state.db
                assert db.execute("SELECT COUNT(*) FROM files").fetchone()[0] == len(granted) + 1
                assert db.execute("SELECT COUNT(*) FROM slots").fetchone()[0] == len(granted) + 1
                # asking again for a granted file replaces its slot: still one slot per file
                first = granted[0]
                req0 = SlotRequest(sha256=first.sha256, size=first.size,
                                   policy_version=2, work_units=10, counter=0)
                for _ in range(20):
                    await c.call("POST", "/uploads", req0, response=UploadSlot)
                assert db.execute("SELECT COUNT(*) FROM slots").fetchone()[0] == len(granted) + 1
    asyncio.run(t())
