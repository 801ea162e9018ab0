"""Every refusal the orchestrator's handlers make reaches a real client over loopback as its
class: the ones that need no chain on the API served from its parts, the ones that read the
chain (validator role, submissions) on the shared pool of real processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.protocol.batches import Batch, Leaf
from meshrl.wire import ErrorCode, SignedClient, WireHTTPError, refusal_classes
from meshrl.wire.models import (
    BatchLeaf,
    BatchPost,
    FileStatus,
    Heartbeat,
    LedgerPage,
    NodeState,
    SlotRequest,
    StepUpdate,
    UploadSlot,
    Verdict,
    VerdictAck,
    VerdictKind,
)

from .conftest import Pool, next_counter, parquet_framed
from .net import run, wait_for
from .parts import Served, address, api_from_parts, key

pytestmark = pytest.mark.anvil  # some tests start anvil (tests/anvil_rule.py)

E = ErrorCode


async def expect(code: ErrorCode, attempt: Awaitable[Any]) -> WireHTTPError:
    with pytest.raises(WireHTTPError) as got:
        await attempt
    e = got.value
    assert type(e) is refusal_classes()[code], e
    assert (e.code, e.status) == (code, code.status), e
    return e


def blob(tmp: Path, name: str, size: int = 300) -> tuple[Path, str]:
    data = parquet_framed(os.urandom(size - 12))
    path = tmp / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def slot_request(sha: str, size: int = 300, version: int = 3,
                 units: int = 10, counter: int | None = None) -> SlotRequest:
    return SlotRequest(sha256=sha, size=size, policy_version=version,
                       work_units=units,
                       counter=next_counter() if counter is None else counter)


# ---- the API from its parts: members n1, n2; reader "trainer"; nobody else
PartsCase = Callable[[Served, Path, Callable[[str], SignedClient]], Awaitable[Any]]


async def _grant(c: SignedClient, sha: str, size: int = 300) -> UploadSlot:
    return await c.call("POST", "/uploads", slot_request(sha, size), response=UploadSlot)


async def _not_in_pool(s: Served, tmp: Path, client: Any) -> Any:
    return await client("stranger").call("POST", "/heartbeat", Heartbeat())


async def _not_a_reader(s: Served, tmp: Path, client: Any) -> Any:
    return await client("n1").call("POST", "/step", StepUpdate(step=9))


async def _no_invite(s: Served, tmp: Path, client: Any) -> Any:
    return await client("stranger").call("GET", "/invite")


async def _file_too_large(s: Served, tmp: Path, client: Any) -> Any:
    return await client("n1").call("POST", "/uploads", slot_request("aa" * 32, size=2001))


async def _too_many_units(s: Served, tmp: Path, client: Any) -> Any:
    return await client("n1").call("POST", "/uploads", slot_request("aa" * 32, units=1001))


async def _stale_work(s: Served, tmp: Path, client: Any) -> Any:
    # step 3, async level 1: versions 2 and 3
    return await client("n1").call("POST", "/uploads", slot_request("aa" * 32, version=1))


async def _file_already_known(s: Served, tmp: Path, client: Any) -> Any:
    await _grant(client("n1"), "bb" * 32)
    return await _grant(client("n2"), "bb" * 32)


async def _counter_out_of_range(s: Served, tmp: Path, client: Any) -> Any:
    return await client("n1").call("POST", "/uploads", slot_request("aa" * 32, counter=1 << 12))


async def _counter_used(s: Served, tmp: Path, client: Any) -> Any:
    # the same (node, version, counter) for another file: one generation per counter
    await client("n1").call("POST", "/uploads", slot_request("bb" * 32, counter=5))
    return await client("n1").call("POST", "/uploads", slot_request("cc" * 32, counter=5))


async def _file_already_uploaded(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    req = slot_request(sha)
    slot = await client("n1").call("POST", "/uploads", req, response=UploadSlot)
    await client("n1").upload("PUT", slot.url, path, sha)
    return await client("n1").call("POST", "/uploads", req)  # asked again after a crash


async def _upload_in_progress(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    slot = await _grant(client("n1"), sha)
    assert s.state.claim_slot(slot.slot_id)  # another connection is uploading through it
    return await client("n1").upload("PUT", slot.url, path, sha)


async def _not_a_rollout_file(s: Served, tmp: Path, client: Any) -> Any:
    data = os.urandom(300)  # no Parquet framing: never stored
    (tmp / "r").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    slot = await _grant(client("n1"), sha)
    return await client("n1").upload("PUT", slot.url, tmp / "r", sha)


async def _bad_slot_id(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    return await client("n1").upload("PUT", "/uploads/not-a-slot", path, sha)


async def _no_such_slot(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    return await client("n1").upload("PUT", "/uploads/" + "ab" * 16, path, sha)


async def _slot_of_another_node(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    slot = await _grant(client("n1"), sha)
    return await client("n2").upload("PUT", slot.url, path, sha)


async def _slot_already_used(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    slot = await _grant(client("n1"), sha)
    await client("n1").upload("PUT", slot.url, path, sha)
    return await client("n1").upload("PUT", slot.url, path, sha)


async def _slot_expired(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    # a slot past its expiry that the expiry loop (not running here) has not removed yet
    s.state.grant_slot("cd" * 16, address("n1"), address("p1"), sha, 300, 3, 10, 0,
                       expires_at=time.time() - 1)
    return await client("n1").upload("PUT", "/uploads/" + "cd" * 16, path, sha)


async def _sha256_mismatch(s: Served, tmp: Path, client: Any) -> Any:
    (_, granted), (other, sha) = blob(tmp, "g"), blob(tmp, "o")
    slot = await _grant(client("n1"), granted)
    return await client("n1").upload("PUT", slot.url, other, sha)  # honest about other bytes


async def _size_mismatch(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f", size=200)
    slot = await _grant(client("n1"), sha, size=300)
    return await client("n1").upload("PUT", slot.url, path, sha)


async def _bad_file_name(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").get_bytes("/files/..%2Fstate.db")


async def _no_such_file(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").get_bytes("/files/" + "ee" * 32)


async def _step_goes_back(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").call("POST", "/step", StepUpdate(step=1))


async def _taken_beyond_accepted(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").call("POST", "/step", StepUpdate(step=3, taken_through=1,
                                                                    ahead=2))


async def _too_many_held(s: Served, tmp: Path, client: Any) -> Any:
    # four held ledger reads of the trainer (work.max_held_per_signer), then a fifth
    held = [asyncio.create_task(client(f"trainer{i}").call(
        "GET", "/ledger", query={"accepted_after": 0, "wait": 1.0})) for i in range(4)]
    await asyncio.sleep(0.3)
    try:
        return await client("trainer").call("GET", "/ledger",
                                             query={"accepted_after": 0, "wait": 1.0})
    finally:
        await asyncio.gather(*held)


async def _unsubmitted_uploads(s: Served, tmp: Path, client: Any) -> Any:
    path, sha = blob(tmp, "f")
    slot = await _grant(client("n1"), sha)
    await client("n1").upload("PUT", slot.url, path, sha)
    # uploaded longer than work.submit_s ago, never submitted on chain
    s.state.db.execute("UPDATE files SET updated_at = updated_at - 301 WHERE sha256 = ?",
                       (sha,))
    return await _grant(client("n1"), "dd" * 32)


async def _uploaded(c: SignedClient, tmp: Path, name: str) -> BatchLeaf:
    """A file granted to and uploaded by `c`'s node: its leaf."""
    path, sha = blob(tmp, name)
    req = slot_request(sha)
    slot = await c.call("POST", "/uploads", req, response=UploadSlot)
    await c.upload("PUT", slot.url, path, sha)
    return BatchLeaf(sha256=sha, work_units=req.work_units, step=req.policy_version,
                     counter=req.counter)


async def _batch_too_large(s: Served, tmp: Path, client: Any) -> Any:
    leaves = [await _uploaded(client("n1"), tmp, f"f{i}") for i in range(3)]  # 2 per batch
    return await client("n1").call("POST", "/batches", BatchPost(leaves=leaves))


async def _bad_leaf(s: Served, tmp: Path, client: Any) -> Any:
    mine, theirs = await _uploaded(client("n1"), tmp, "a"), await _uploaded(client("n2"), tmp,
                                                                           "b")
    lying = mine.model_copy(update={"work_units": mine.work_units + 1})
    _, never = blob(tmp, "never-uploaded")
    ghost = mine.model_copy(update={"sha256": never})
    for leaves in ([mine, theirs], [lying], [ghost], [mine, mine]):
        with pytest.raises(WireHTTPError) as got:
            await client("n1").call("POST", "/batches", BatchPost(leaves=leaves))
        assert type(got.value) is refusal_classes()[E.BAD_LEAF], leaves
    assert s.state.file(mine.sha256).batch_id == ""  # nothing recorded by a refusal
    return await client("n1").call("POST", "/batches", BatchPost(leaves=[theirs]))


async def _file_in_another_batch(s: Served, tmp: Path, client: Any) -> Any:
    a, b = await _uploaded(client("n1"), tmp, "a"), await _uploaded(client("n1"), tmp, "b")
    await client("n1").call("POST", "/batches", BatchPost(leaves=[a]))
    await client("n1").call("POST", "/batches", BatchPost(leaves=[a]))  # again: idempotent
    return await client("n1").call("POST", "/batches", BatchPost(leaves=[b, a]))


async def _batch_mismatch(s: Served, tmp: Path, client: Any) -> Any:
    a = await _uploaded(client("n1"), tmp, "a")
    b = Batch.of([Leaf(address("n1"), bytes.fromhex(a.sha256), a.work_units, a.step,
                       a.counter)])
    # the chain announced this batch (node, root) with more units than its leaves hold
    s.state.batch_seen(b.id.hex(), address("n1"), b.root.hex(), 1, a.work_units + 5)
    return await client("n1").call("POST", "/batches", BatchPost(leaves=[a]))


async def _bad_batch_id(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").call("GET", "/batches/..%2Fstate")


async def _no_such_batch(s: Served, tmp: Path, client: Any) -> Any:
    return await client("trainer").call("GET", "/batches/" + "ab" * 32)


PARTS: dict[ErrorCode, PartsCase] = {
    E.BATCH_TOO_LARGE: _batch_too_large, E.BAD_LEAF: _bad_leaf,
    E.FILE_IN_ANOTHER_BATCH: _file_in_another_batch, E.BATCH_MISMATCH: _batch_mismatch,
    E.BAD_BATCH_ID: _bad_batch_id, E.NO_SUCH_BATCH: _no_such_batch,
    E.TOO_MANY_HELD: _too_many_held, E.UNSUBMITTED_UPLOADS: _unsubmitted_uploads,
    E.NOT_IN_POOL: _not_in_pool, E.NOT_A_READER: _not_a_reader, E.NO_INVITE: _no_invite,
    E.FILE_TOO_LARGE: _file_too_large, E.TOO_MANY_WORK_UNITS: _too_many_units,
    E.STALE_WORK: _stale_work, E.FILE_ALREADY_KNOWN: _file_already_known,
    E.BAD_SLOT_ID: _bad_slot_id, E.NO_SUCH_SLOT: _no_such_slot,
    E.SLOT_OF_ANOTHER_NODE: _slot_of_another_node, E.SLOT_ALREADY_USED: _slot_already_used,
    E.SLOT_EXPIRED: _slot_expired, E.SHA256_MISMATCH: _sha256_mismatch,
    E.SIZE_MISMATCH: _size_mismatch, E.BAD_FILE_NAME: _bad_file_name,
    E.NO_SUCH_FILE: _no_such_file, E.STEP_GOES_BACK: _step_goes_back,
    E.COUNTER_OUT_OF_RANGE: _counter_out_of_range, E.COUNTER_USED: _counter_used,
    E.FILE_ALREADY_UPLOADED: _file_already_uploaded, E.UPLOAD_IN_PROGRESS: _upload_in_progress,
    E.NOT_A_ROLLOUT_FILE: _not_a_rollout_file, E.TAKEN_BEYOND_ACCEPTED: _taken_beyond_accepted,
}


@pytest.mark.parametrize("code", list(PARTS), ids=lambda c: c.value)
def test_refusal_without_a_chain(code: ErrorCode, tmp_path: Path) -> None:
    cfg = OrchestratorConfig(pool_id=1, work={"step": 3, "max_file_bytes": 2000},
                             rules={"async_level": 1, "files_per_step": 1 << 12,
                                    "batch": {"files": 2}})

    async def t() -> None:
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            for n in ("n1", "n2"):
                s.state.upsert_node(address(n), address("p1"), NodeState.HEALTHY, time.time())
            clients: dict[str, SignedClient] = {}

            def client(name: str) -> SignedClient:  # "trainer2": the trainer's key too
                if name not in clients:
                    clients[name] = SignedClient(s.url, key(name.rstrip("0123456789")
                                                            if name.startswith("trainer")
                                                            else name))
                return clients[name]
            try:
                await expect(code, PARTS[code](s, tmp_path, client))
            finally:
                for c in clients.values():
                    await c.close()
            assert s.chain_untouched()
    asyncio.run(t())


# ---- on the pool of real processes (the validator role and submissions are on chain)
async def _submitted(pool: Pool, node: str, provider: str, tmp: Path, name: str,
                     submit: bool = True) -> tuple[str, str]:
    """A file granted to and uploaded by `node`, submitted on chain unless not `submit`; its
    sha256 and work id once the ledger has it as it should be."""
    path, sha = blob(tmp, name)
    async with SignedClient(pool.orch.url, pool.key(node)) as c, \
            SignedClient(pool.orch.url, pool.key("trainer")) as trainer:
        slot = await _grant(c, sha)
        await c.upload(slot.method, slot.url, path, sha)
        if not submit:
            return sha, ""
        who = pool.chain.accounts[node].address
        await asyncio.to_thread(pool.chain.client(provider).submit_work, pool.chain.pool, who,
                                bytes.fromhex(sha), 10)

        async def on_ledger() -> str:
            page = await trainer.call("GET", "/ledger", query={"sha256": sha},
                                      response=LedgerPage)
            return next((e.work_id for e in page.entries
                         if e.status == FileStatus.SUBMITTED), "")
        return sha, await wait_for(on_ledger)


async def _not_a_validator(pool: Pool, tmp: Path) -> Any:
    async with SignedClient(pool.orch.url, pool.key("stranger")) as c:
        return await c.call("POST", "/verdicts", Verdict(sha256="aa" * 32, verdict="accept"))


async def _ledger_not_a_reader(pool: Pool, tmp: Path) -> Any:
    async with SignedClient(pool.orch.url, pool.key("n1")) as c:  # asks the chain: no role
        return await c.call("GET", "/ledger")


async def _no_such_submission(pool: Pool, tmp: Path) -> Any:
    async with SignedClient(pool.orch.url, pool.key("val")) as v:
        return await v.call("POST", "/verdicts", Verdict(sha256="aa" * 32, verdict="accept",
                                                         work_id="ab" * 32))


async def _not_submitted_yet(pool: Pool, tmp: Path) -> Any:
    sha, _ = await _submitted(pool, "n2", "p1", tmp, "uploaded-only", submit=False)
    async with SignedClient(pool.orch.url, pool.key("val")) as v:
        return await v.call("POST", "/verdicts", Verdict(sha256=sha, verdict="accept"))


async def _work_id_of_another_file(pool: Pool, tmp: Path) -> Any:
    _, wid = await _submitted(pool, "n2", "p1", tmp, "one")
    async with SignedClient(pool.orch.url, pool.key("val")) as v:
        return await v.call("POST", "/verdicts", Verdict(sha256="aa" * 32, verdict="accept",
                                                         work_id=wid))


async def _ledger_entry(pool: Pool, wid: str) -> Any:
    async with SignedClient(pool.orch.url, pool.key("trainer")) as trainer:
        page = await trainer.call("GET", "/ledger", query={"work_id": wid},
                                  response=LedgerPage)
        return page.entries[0]


async def _soft_invalidated(pool: Pool, tmp: Path, name: str) -> tuple[str, str]:
    """A file of n2 submitted, soft-invalidated on chain by `val` with no verdict posted, once
    the ledger has followed the chain; its sha256 and work id."""
    sha, wid = await _submitted(pool, "n2", "p1", tmp, name)
    await asyncio.to_thread(pool.chain.client("val").soft_invalidate, bytes.fromhex(wid))

    async def moved_on() -> bool:
        return (await _ledger_entry(pool, wid)).status == FileStatus.SOFT_INVALIDATED
    await wait_for(moved_on)
    return sha, wid


async def _not_awaiting_verdict(pool: Pool, tmp: Path) -> Any:
    sha, wid = await _soft_invalidated(pool, tmp, "invalidated")
    async with SignedClient(pool.orch.url, pool.key("val")) as v:
        return await v.call("POST", "/verdicts", Verdict(sha256=sha, verdict="accept",
                                                         work_id=wid))


POOL: dict[ErrorCode, Callable[[Pool, Path], Awaitable[Any]]] = {
    E.NOT_A_VALIDATOR: _not_a_validator, E.NO_SUCH_SUBMISSION: _no_such_submission,
    E.NOT_SUBMITTED_YET: _not_submitted_yet, E.WORK_ID_OF_ANOTHER_FILE: _work_id_of_another_file,
    E.NOT_AWAITING_VERDICT: _not_awaiting_verdict,
}


@pytest.mark.parametrize("code", list(POOL), ids=lambda c: c.value)
def test_refusal_on_the_pool(code: ErrorCode, pool: Pool, tmp_path: Path) -> None:
    run(expect(code, POOL[code](pool, tmp_path)))


def test_a_non_reader_is_refused_the_ledger_after_the_chain_says_so(pool: Pool,
                                                                     tmp_path: Path) -> None:
    run(expect(E.NOT_A_READER, _ledger_not_a_reader(pool, tmp_path)))


def test_join_whose_chain_cannot_answer_is_refused_503(tmp_path: Path) -> None:
    """The view's chain has no contracts at all (the read of the pool fails): `GET /join`
    answers `chain_unavailable`, typed (a real RPC outage: test_join_budget.py)."""
    async def t() -> None:
        async with api_from_parts(tmp_path) as s, SignedClient(s.url, key("n1")) as c:
            e = await expect(E.CHAIN_UNAVAILABLE, c.call("GET", "/join"))
            assert "\n" not in e.detail
    asyncio.run(t())


def test_every_code_the_handlers_declare_has_a_case(tmp_path: Path) -> None:
    """The routes' own refusals (their OpenAPI error responses) are each exercised above."""
    async def t() -> set[ErrorCode]:
        async with api_from_parts(tmp_path) as s:
            return {c for r in s.api.routes() for c in r.refusals}
    assert asyncio.run(t()) == set(PARTS) | set(POOL) | {E.CHAIN_UNAVAILABLE}


def test_a_verdicts_reason_after_the_chains_invalidation_is_recorded_once(
        pool: Pool, tmp_path: Path) -> None:
    """A validator follows the chain itself and may invalidate work before this ledger has
    seen the submission, so its reason can only be posted after the chain's event moved the
    row. That reason is recorded (the status stays the chain's), but only when it comes from
    the validator the chain names, says what the chain did, and the row has none yet."""
    async def t() -> None:
        sha, wid = await _soft_invalidated(pool, tmp_path, "late-reason")
        async with SignedClient(pool.orch.url, pool.key("val")) as v:
            assert (await _ledger_entry(pool, wid)).verdict is None
            await expect(E.NOT_AWAITING_VERDICT, v.call("POST", "/verdicts", Verdict(
                sha256=sha, verdict="hard_invalid", reason="not what the chain did",
                work_id=wid)))
            ack = await v.call("POST", "/verdicts", Verdict(
                sha256=sha, verdict="soft_invalid", reason="rewards: 1 of 8 rows differ",
                work_id=wid), response=VerdictAck)
            assert ack.status == FileStatus.SOFT_INVALIDATED
            got = await _ledger_entry(pool, wid)
            assert (got.status, got.verdict, got.verdict_reason) == (
                FileStatus.SOFT_INVALIDATED, VerdictKind.SOFT_INVALID,
                "rewards: 1 of 8 rows differ")
            await expect(E.NOT_AWAITING_VERDICT, v.call("POST", "/verdicts", Verdict(
                sha256=sha, verdict="soft_invalid", reason="a second text", work_id=wid)))
            again = await _ledger_entry(pool, wid)
            assert (again.verdict, again.verdict_reason) == (got.verdict, got.verdict_reason)
    run(t())
