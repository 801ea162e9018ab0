"""The orchestrator's API needs only its parts: `/ledger` and `/health` served over real HTTP
from a State on a temporary SQLite file, with no `Orchestrator`, no anvil and no deployment
(the chain view holds no contracts, and nothing asks it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.orchestrator.state import Grant
from meshrl.wire import SignedClient
from meshrl.wire.models import FileStatus, Health, LedgerPage, NodeState

from .parts import address, api_from_parts, key

SHA = "ab" * 32


def test_ledger_and_health_from_the_parts(tmp_path: Path) -> None:
    cfg = OrchestratorConfig(pool_id=7, work={"step": 4}, rules={"async_level": 1})

    async def t() -> tuple[LedgerPage, Health, bool]:
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            n1, p1 = address("n1"), address("p1")
            s.state.upsert_node(n1, p1, NodeState.HEALTHY, time.time())
            assert s.state.grant_slot("cd" * 16, n1, p1, SHA, 300, 4, 12, 0,
                                      time.time() + 60) is Grant.GRANTED
            s.state.finish_upload("cd" * 16, SHA)
            async with SignedClient(s.url, key("trainer")) as trainer:
                page = await trainer.call("GET", "/ledger", query={"policy_version": 4},
                                          response=LedgerPage)
            async with aiohttp.ClientSession() as http, http.get(s.url + "/health") as r:
                health = Health.model_validate(await r.json())
            return page, health, s.chain_untouched()
    page, health, untouched = asyncio.run(t())
    [entry] = page.entries
    assert (entry.sha256, entry.node, entry.status, entry.work_units, entry.download) == (
        SHA, address("n1"), FileStatus.UPLOADED, 12, f"/files/{SHA}")
    assert page.next_after == entry.seq
    assert health.service == "orchestrator"
    assert (health.info["pool_id"], health.info["step"], health.info["files"]) == (
        7, 4, {"uploaded": 1})
    assert health.info["nodes"]["healthy"] == 1
    assert health.info["signatures"]["verified"] == 1  # the trainer's signed ledger read
    assert untouched  # a configured reader never makes the API ask the chain
