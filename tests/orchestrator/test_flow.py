"""A file's whole life through real processes: slot, upload, submission on chain, a validator's
verdict, the trainer's ledger read and download; and a silent node's ejection."""

from __future__ import annotations

import asyncio
import hashlib
import time

import aiohttp
import pytest

from meshrl.pool import PoolRules, WorkOrder
from meshrl.wire import (
    NoInvite,
    NotAReader,
    NotInPool,
    NotSubmittedYet,
    SignedClient,
    read_rollout_file,
    write_rollout_file,
)
from meshrl.wire.models import (
    FileStatus,
    Heartbeat,
    LedgerPage,
    NodeEntry,
    NodeState,
    NodeStatus,
    PoolNode,
    PoolNodes,
    SlotRequest,
    UploadSlot,
    Verdict,
    VerdictAck,
)
from wire.helpers import sample_rollout  # the wire tests' sample file (tests/ is on sys.path)

from .conftest import Pool, next_counter
from .net import at_least, candidate_listings, onboard, run, wait_for

pytestmark = pytest.mark.anvil


def make_file(pool: Pool, name: str, seed: int) -> tuple:
    rf = sample_rollout(seed=seed)
    rf.header.node = pool.chain.accounts["n1"].address
    rf.header.provider = pool.chain.accounts["p1"].address
    rf.header.pool_id = pool.chain.pool
    path = pool.tmp / name
    sha = write_rollout_file(path, rf)
    return path, sha, rf


async def upload(o: SignedClient, path, sha: str, version: int = 3,
                 units: int = 54) -> UploadSlot:
    req = SlotRequest(sha256=sha, size=path.stat().st_size, policy_version=version,
                      work_units=units, counter=next_counter())
    slot = await o.call("POST", "/uploads", req, response=UploadSlot)
    await o.upload(slot.method, slot.url, path, sha)
    return slot


def test_work_order(pool: Pool) -> None:
    async def t() -> WorkOrder:
        async with SignedClient(pool.orch.url, pool.key("n1")) as o:
            return await o.call("GET", "/work", response=WorkOrder)
    w = run(t())
    assert (w.rules.pool_id, w.step, w.policy_versions, w.rules.async_level) == (
        pool.chain.pool, 3, [2, 3], 1)
    assert w.rules.proof_profile == "any-hardware"  # the default, published to every node


def test_rules_are_public_before_staking(pool: Pool) -> None:
    """`GET /rules` answers an unsigned request: a worker reads the proof profile first."""
    async def t() -> PoolRules:
        async with aiohttp.ClientSession() as s, s.get(f"{pool.orch.url}/rules") as r:
            assert r.status == 200
            return PoolRules.model_validate(await r.json())
    rules = run(t())
    assert (rules.pool_id, rules.proof_profile, rules.async_level) == (pool.chain.pool,
                                                                       "any-hardware", 1)


def test_file_life_to_the_trainer(pool: Pool) -> None:
    path, sha, rf = make_file(pool, "life.parquet", seed=1)

    async def t() -> None:
        async with SignedClient(pool.orch.url, pool.key("n1")) as node, \
                SignedClient(pool.orch.url, pool.key("val")) as val, \
                SignedClient(pool.orch.url, pool.key("trainer")) as trainer:
            await upload(node, path, sha)
            page = await trainer.call("GET", "/ledger", query={"policy_version": 3},
                                      response=LedgerPage)
            [entry] = [e for e in page.entries if e.sha256 == sha]
            assert (entry.status, entry.size, entry.work_units) == (FileStatus.UPLOADED,
                                                                    path.stat().st_size, 54)
            try:
                await val.call("POST", "/verdicts", Verdict(sha256=sha, verdict="accept"))
                raise AssertionError("a verdict before the chain submission was taken")
            except NotSubmittedYet as e:  # the chain's submission has not reached the ledger
                assert e.status == 409 and e.detail == "file is uploaded"
            p1 = pool.chain.client("p1")
            await asyncio.to_thread(p1.submit_work, pool.chain.pool,
                                    pool.chain.accounts["n1"].address, bytes.fromhex(sha), 54)

            async def submitted() -> bool:
                page = await trainer.call("GET", "/ledger", query={"policy_version": 3},
                                          response=LedgerPage)
                return any(e.sha256 == sha and e.status == FileStatus.SUBMITTED
                           for e in page.entries)
            await wait_for(submitted)
            ack = await val.call("POST", "/verdicts", Verdict(sha256=sha, verdict="accept"),
                                 response=VerdictAck)
            assert ack.status == FileStatus.ACCEPTED
            page = await trainer.call("GET", "/ledger",
                                      query={"policy_version": 3, "status": "accepted"},
                                      response=LedgerPage)
            [entry] = [e for e in page.entries if e.sha256 == sha]  # other tests' files too
            one = await val.call("GET", "/ledger", query={"sha256": sha}, response=LedgerPage)
            assert one.entries == [entry]
            assert (entry.sha256, entry.policy_version, entry.download) == (
                sha, 3, f"/files/{sha}")
            data = await trainer.get_bytes(entry.download)
            assert hashlib.sha256(data).hexdigest() == sha
            assert read_rollout_file(data).header == rf.header
            # a validator reads the same file; a node may not
            assert await val.get_bytes(entry.download) == data
            try:
                await node.get_bytes(entry.download)
                raise AssertionError("a node read the ledger's files")
            except NotAReader as e:
                assert e.status == 403
    run(t())


def test_soft_invalidation_on_chain_reaches_the_ledger(pool: Pool) -> None:
    path, sha, _ = make_file(pool, "soft.parquet", seed=2)

    async def t() -> None:
        async with SignedClient(pool.orch.url, pool.key("n1")) as node, \
                SignedClient(pool.orch.url, pool.key("val")) as val, \
                SignedClient(pool.orch.url, pool.key("trainer")) as trainer:
            await upload(node, path, sha)
            await asyncio.to_thread(pool.chain.client("p1").submit_work, pool.chain.pool,
                                    pool.chain.accounts["n1"].address, bytes.fromhex(sha), 54)

            async def status() -> FileStatus:
                page = await trainer.call("GET", "/ledger", response=LedgerPage)
                return next(e.status for e in page.entries if e.sha256 == sha)
            await wait_for(lambda: _is(status, FileStatus.SUBMITTED))
            ack = await val.call("POST", "/verdicts", Verdict(
                sha256=sha, verdict="soft_invalid", reason="rewards"), response=VerdictAck)
            assert ack.status == FileStatus.SUBMITTED  # waits for the chain to agree
            wid = pool.chain.fed.work_id(pool.chain.accounts["n1"].address, bytes.fromhex(sha))
            await asyncio.to_thread(pool.chain.client("val").soft_invalidate, wid)
            await wait_for(lambda: _is(status, FileStatus.SOFT_INVALIDATED))
            page = await trainer.call("GET", "/ledger", query={"status": "accepted"},
                                      response=LedgerPage)
            assert sha not in {e.sha256 for e in page.entries}
    run(t())


async def _is(get, want) -> bool:  # type: ignore[no-untyped-def]
    return (await get()) == want


def test_silent_node_is_ejected_and_must_be_invited_again(pool: Pool) -> None:
    n3 = pool.chain.accounts["n3"].address

    async def node(trainer: SignedClient) -> PoolNode:
        nodes = await trainer.call("GET", "/nodes", response=PoolNodes)
        return next(n for n in nodes.nodes if n.address == n3)

    async def ejected(trainer: SignedClient, seen: list[tuple[float, PoolNode]]) -> bool:
        n = await node(trainer)
        seen.append((time.time(), n))
        return n.state is NodeState.EJECTED

    async def t() -> None:
        await onboard(pool.chain, pool.disc.url, pool.orch.url, "n3", "p1")
        assert pool.chain.fed.node(n3).pool == pool.chain.pool
        async with SignedClient(pool.orch.url, pool.key("trainer")) as trainer, \
                SignedClient(pool.orch.url, pool.key("n3")) as o, \
                SignedClient(pool.disc.url, pool.key("n3")) as d:
            seen: list[tuple[float, PoolNode]] = []
            await wait_for(lambda: ejected(trainer, seen), timeout=15, every=0.1)
            assert "unhealthy" in {n.state.value for _, n in seen}
            # three missed 1 s heartbeats, not fewer (the rule: the first is missed 1.5 s after
            # the last heartbeat, each further one 1 s later): silence by the orchestrator's
            # record of the last heartbeat, when the ejection was first seen
            at, last = seen[-1]
            assert at - last.last_seen >= 3.0, at - last.last_seen
            assert pool.chain.fed.node(n3).pool == 0  # ejected on chain
            try:
                await o.call("POST", "/heartbeat", Heartbeat())
                raise AssertionError("an ejected node's heartbeat was taken")
            except NotInPool as e:
                assert e.status == 403

            async def disc_ejected() -> bool:
                entry = await d.call("GET", f"/nodes/{n3}", response=NodeEntry)
                return entry.status == NodeStatus.EJECTED
            await wait_for(disc_ejected)
            await onboard(pool.chain, pool.disc.url, pool.orch.url, "n3", "p1")  # invited again
            assert pool.chain.fed.node(n3).pool == pool.chain.pool
            # still silent, so ejected again: nothing changes in the pool after this test
            await wait_for(lambda: ejected(trainer, []), timeout=15)
    run(t())


def test_health_metrics_and_openapi(pool: Pool) -> None:
    import aiohttp

    async def t() -> tuple[dict, str, dict, dict]:
        async with aiohttp.ClientSession() as s:
            async with s.get(pool.orch.url + "/health") as r:
                health = await r.json()
            async with s.get(pool.orch.url + "/metrics") as r:
                metrics = await r.text()
            async with s.get(pool.orch.url + "/openapi.json") as r:
                doc = await r.json()
            async with s.get(pool.disc.url + "/openapi.json") as r:
                disc = await r.json()
        return health, metrics, doc, disc
    health, metrics, doc, disc = run(t())
    assert health["service"] == "orchestrator" and health["info"]["pool_id"] == pool.chain.pool
    assert health["info"]["nodes"]["healthy"] >= 2
    assert 'meshrl_http_requests_total{route="/heartbeat",service="orchestrator",status="200"}' \
        in metrics
    assert "meshrl_orchestrator_heartbeats_total" in metrics
    assert set(doc["paths"]) >= {"/heartbeat", "/work", "/uploads", "/uploads/{slot_id}",
                                 "/verdicts", "/ledger", "/files/{sha256}", "/invite", "/step"}
    ledger = doc["paths"]["/ledger"]["get"]
    assert {p["name"] for p in ledger["parameters"]} == {"policy_version", "status", "sha256",
                                                         "work_id", "after", "accepted_after",
                                                         "limit", "wait"}
    work = doc["paths"]["/work"]["get"]
    assert {p["name"] for p in work["parameters"]} == {"version", "wait"}
    assert "LedgerEntry" in doc["components"]["schemas"]
    verdicts = doc["paths"]["/verdicts"]["post"]["responses"]
    assert {"not_submitted_yet", "not_awaiting_verdict"} <= set(
        verdicts["409"]["content"]["application/json"]["schema"]["allOf"][1]["properties"]
        ["code"]["enum"])
    assert doc["components"]["schemas"]["ErrorCode"]["enum"] == \
        disc["components"]["schemas"]["ErrorCode"]["enum"]  # one vocabulary
    assert set(disc["paths"]) == {"/health", "/nodes", "/nodes/{address}",
                                  "/pools/{pool_id}/nodes"}


def test_candidates_that_do_not_qualify_get_no_invite(pool: Pool) -> None:
    from .net import announcement

    async def t() -> None:
        # n4 first announces too few cores for the pool (min 4), then enough
        async with SignedClient(pool.disc.url, pool.key("n4")) as d, \
                SignedClient(pool.orch.url, pool.key("n4")) as o:
            await d.call("PUT", "/nodes", announcement(pool.chain, "p1", cores=2))
            # a whole onboarding pass has considered it: the orchestrator asked discovery for
            # the pool's candidates twice since (it asks again only after a pass is done)
            seen = await candidate_listings(pool.disc.url)
            await wait_for(lambda: at_least(candidate_listings(pool.disc.url), seen + 2),
                           timeout=15)
            try:
                await o.call("GET", "/invite")
                raise AssertionError("an under-provisioned node was invited")
            except NoInvite as e:
                assert e.status == 404
            await d.call("PUT", "/nodes", announcement(pool.chain, "p1", cores=8))
            await wait_for(lambda: o.call("GET", "/invite"), timeout=15)
    run(t())
