"""Pacing: a work order wants a file only while the files the trainer has not taken (granted,
uploaded, submitted, or accepted past what it took) and those being made are fewer than it asked
for; a want is a lease, so members asking at once do not all make the last file; a node that
cannot make a file holds none; the demand survives a restart. Over the real HTTP API, served from
its parts (acceptance is set in the state, as following the chain does)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import aiohttp
import pytest

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.orchestrator.pacing import DEMAND, Pacer
from meshrl.orchestrator.state import PoolStep, State
from meshrl.pool import WorkOrder
from meshrl.wire import (
    InvalidBody,
    InvalidQuery,
    NotAReader,
    ReplayedNonce,
    SignedClient,
    StepGoesBack,
    TakenBeyondAccepted,
    WrongSigner,
    raise_for,
)
from meshrl.wire.models import (
    FileStatus,
    Heartbeat,
    HeartbeatAck,
    LedgerPage,
    NodeState,
    SlotRequest,
    StepUpdate,
    UploadSlot,
)
from meshrl.wire.signing import sign_request

from .conftest import parquet_framed
from .parts import Served, address, api_from_parts, key

NODES = ("n1", "n2", "n3")
FILES_PER_STEP = 2


def _cfg() -> OrchestratorConfig:
    return OrchestratorConfig(pool_id=1, work={"step": 3, "max_file_bytes": 4000},
                              rules={"async_level": 1, "files_per_step": FILES_PER_STEP},
                              guard={"rate_per_minute": 100_000, "rate_burst": 1000})


async def _want(url: str, node: str) -> WorkOrder:
    async with SignedClient(url, key(node)) as c:
        return await c.call("GET", "/work", response=WorkOrder)


async def _beat(url: str, node: str, version: int) -> None:
    async with SignedClient(url, key(node)) as c:
        await c.call("POST", "/heartbeat", Heartbeat(policy_version=version, step=version,
                                                      tokens_per_s=1.0, files_pending=0),
                     response=HeartbeatAck)


async def _grant(url: str, node: str, version: int, counter: int) -> str:
    data = parquet_framed(os.urandom(64))
    sha = hashlib.sha256(data).hexdigest()
    async with SignedClient(url, key(node)) as c:
        await c.call("POST", "/uploads", SlotRequest(
            sha256=sha, size=len(data), policy_version=version, work_units=10,
            counter=counter), response=UploadSlot)
    return sha


async def _step(url: str, step: int, taken: int | None, ahead: int | None) -> None:
    async with SignedClient(url, key("trainer")) as c:
        await c.call("POST", "/step", StepUpdate(step=step, taken_through=taken, ahead=ahead),
                     response=HeartbeatAck)


async def _members_beating(s: Served) -> None:
    """Every node of NODES healthy in the served pool's state, each heartbeating at step 3."""
    for n in NODES:
        s.state.upsert_node(address(n), address("p" + n), NodeState.HEALTHY, time.time())
        await _beat(s.url, n, 3)


def test_work_orders_want_what_the_trainer_will_take(tmp_path: Path) -> None:
    async def t() -> None:
        async with api_from_parts(tmp_path, _cfg(), readers=(address("trainer"),)) as s:
            await _members_beating(s)
            # no demand said: not paced
            assert (await _want(s.url, "n1")).files_wanted is None
            await _step(s.url, 3, 0, 2)
            # two files wanted ahead: the first two to ask lease one each, the third waits
            assert (await _want(s.url, "n1")).files_wanted == 1
            assert (await _want(s.url, "n2")).files_wanted == 1
            third = await _want(s.url, "n3")
            assert third.files_wanted == 0 and "demand is met" in third.waiting
            # asking again gives back one's own lease first: n1 keeps its place
            assert (await _want(s.url, "n1")).files_wanted == 1
            # n1's file granted: it is in flight; with n2's lease, the two wanted are covered
            sha = await _grant(s.url, "n1", 3, 0)
            assert (await _want(s.url, "n1")).files_wanted == 0
            assert s.api.pacer.status(time.monotonic())["backlog"] == 1
            # accepted, not yet taken: still the trainer's backlog
            row = s.state.file(sha)
            assert row is not None
            s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
            assert (await _want(s.url, "n3")).files_wanted == 0
            # the trainer took it: its place is free again
            accepted = s.state.file(sha)
            assert accepted is not None and accepted.accepted_seq >= 1
            await _step(s.url, 3, accepted.accepted_seq, 2)
            assert (await _want(s.url, "n3")).files_wanted == 1
            # an invalidated file leaves the backlog (its place is made again)
            bad = await _grant(s.url, "n2", 3, 0)
            assert s.api.pacer.backlog() == 1
            bad_row = s.state.file(bad)
            assert bad_row is not None
            s.state.set_file_status(bad_row.seq, FileStatus.HARD_INVALIDATED)
            assert s.api.pacer.backlog() == 0
            # a dead node's granted file never reaches the chain while it is gone: no backlog
            await _grant(s.url, "n3", 3, 0)
            assert s.api.pacer.backlog() == 1
            s.state.set_node_state(address("n3"), NodeState.DEAD)
            assert s.api.pacer.backlog() == 0
            s.state.set_node_state(address("n3"), NodeState.HEALTHY)
            assert s.api.pacer.backlog() == 1
            # a node that used its counters of its version holds no lease, and says why
            await _grant(s.url, "n1", 3, 1)
            full = await _want(s.url, "n1")
            assert full.files_wanted == 0 and f"its {FILES_PER_STEP} files" in full.waiting
            # files of versions the pool no longer takes are not backlog; a node still on an
            # old version holds no lease
            await _step(s.url, 5, accepted.accepted_seq, 2)
            assert s.api.pacer.backlog() == 0
            old = await _want(s.url, "n2")
            assert old.files_wanted == 0 and "not one the pool takes" in old.waiting
            await _beat(s.url, "n2", 5)
            assert (await _want(s.url, "n2")).files_wanted == 1
            # a move without `ahead` stops pacing
            await _step(s.url, 5, None, None)
            assert (await _want(s.url, "n2")).files_wanted is None
            await _step(s.url, 5, accepted.accepted_seq, 4)
    asyncio.run(t())
    # the demand is in the state: a restarted orchestrator paces as before
    state = State(tmp_path / "orch.db")
    try:
        pacer = Pacer(state, PoolStep(state, 3, 1), 30.0, FILES_PER_STEP)
        assert pacer.demand is not None and pacer.demand.ahead == 4
        assert pacer.demand.taken_through >= 1
    finally:
        state.close()


def test_the_demand_is_shared_by_the_nodes_asking_for_work(tmp_path: Path) -> None:
    """The first node to ask after a move does not make the whole step: a node holding
    ceil(ahead / n) of the backlog waits while n nodes that asked can make a file; a node that
    heartbeats but never asks for work is not counted, so it holds nobody back."""
    cfg = _cfg().model_copy(update={"rules": _cfg().rules.model_copy(
        update={"files_per_step": 8})})

    async def t() -> None:
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            await _members_beating(s)  # n3 heartbeats too, and never asks for work
            await _step(s.url, 3, 0, 4)
            assert (await _want(s.url, "n1")).files_wanted == 1
            first = await _grant(s.url, "n1", 3, 0)
            # alone in asking: its share is the whole demand
            assert (await _want(s.url, "n1")).files_wanted == 1
            second = await _grant(s.url, "n1", 3, 1)
            assert (await _want(s.url, "n2")).files_wanted == 1
            # two nodes ask: n1 holds 2 of 4, its share; the rest is n2's
            held = await _want(s.url, "n1")
            assert held.files_wanted == 0 and "holds its share" in held.waiting, held.waiting
            await _grant(s.url, "n2", 3, 0)
            assert (await _want(s.url, "n2")).files_wanted == 1
            await _grant(s.url, "n2", 3, 1)
            assert "demand is met" in (await _want(s.url, "n1")).waiting
            # the trainer takes n1's two files: n1's share is free again
            for sha in (first, second):
                row = s.state.file(sha)
                assert row is not None
                s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
            taken = s.state.file(second)
            assert taken is not None
            await _step(s.url, 3, taken.accepted_seq, 4)
            assert (await _want(s.url, "n1")).files_wanted == 1
    asyncio.run(t())


def test_a_lease_expires(tmp_path: Path) -> None:
    """A node that leased a file and went quiet gives its place back after `lease_s`."""
    state = State(tmp_path / "orch.db")
    try:
        pool = PoolStep(state, 3, 1)
        for n in NODES[:2]:
            state.upsert_node(address(n), address("p" + n), NodeState.HEALTHY, time.time())
            state.heartbeat(address(n), time.time(), 3, 3, 1.0, 0)
        pacer = Pacer(state, pool, lease_s=5.0, files_per_step=FILES_PER_STEP)
        pacer.set_demand(0, 1)
        assert pacer.want(address("n1"), now=100.0).files == 1
        assert pacer.want(address("n2"), now=104.0).files == 0
        assert pacer.want(address("n2"), now=105.5).files == 1
        assert pacer.status(105.5)["leases"] == 1
        # a wait for demand cannot help a node on a version the pool does not take: it is
        # told to fetch, and a held work order answers at once
        state.heartbeat(address("n1"), time.time(), 1, 3, 1.0, 0)
        stale = pacer.want(address("n1"), now=106.0)
        assert stale.files == 0 and stale.must_fetch and "fetch a newer" in stale.why
        assert not pacer.want(address("n2"), now=106.0).must_fetch
    finally:
        state.close()


async def _raw(url: str, body: bytes, headers: dict[str, str]) -> None:
    """One raw `POST /step`; a refusal raises its class, as the client does."""
    async with aiohttp.ClientSession() as s, s.post(
            url + "/step", data=body, headers={**headers, "content-type": "application/json"}
    ) as r:
        raise_for(r.status, await r.read())


async def _audience(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/identity") as r:
        return str((await r.json())["audience"])


def test_a_step_update_not_the_trainers_own_changes_nothing(tmp_path: Path) -> None:
    """The hostile side of pacing: a StepUpdate signed by a node (not a reader), the trainer's
    own request sent again (its nonce), values out of range (negative, past the protocol's
    bound, `taken_through` past the last acceptance number) are each refused with their typed
    error, and neither the pool's step nor the demand nor what members are told moves."""
    async def t() -> None:
        async with api_from_parts(tmp_path, _cfg(), readers=(address("trainer"),)) as s:
            await _members_beating(s)
            sha = await _grant(s.url, "n1", 3, 0)
            row = s.state.file(sha)
            assert row is not None
            s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
            accepted = s.state.file(sha)
            assert accepted is not None and accepted.accepted_seq == 1
            # the trainer's own word: step 4, taken nothing yet, 2 files ahead
            body = StepUpdate(step=4, taken_through=0, ahead=2).model_dump_json().encode()
            signed = sign_request(key("trainer"), "POST", "/step", body,
                                  audience=await _audience(s.url)).as_dict()
            await _raw(s.url, body, signed)
            for n in NODES:  # the members load version 4 (3 is the oldest the pool takes now)
                await _beat(s.url, n, 4)

            def seen() -> tuple[int, object, str]:
                d = s.api.pacer.demand
                return s.api.pool.step, d and (d.taken_through, d.ahead), s.state.get_meta(DEMAND)

            before = seen()
            assert before[:2] == (4, (0, 2))
            for n in NODES:  # every member asks once: all three share the demand
                await _want(s.url, n)
            wanted = [(await _want(s.url, n)).files_wanted for n in NODES]
            # the accepted file is backlog (not taken) and n1's share of the 2 ahead: the one
            # place left is another member's
            assert wanted == [0, 1, 0]

            # a node signs a move that would free every place and jump the pool ahead
            forged = StepUpdate(step=9, taken_through=1, ahead=1 << 20)
            async with SignedClient(s.url, key("n2")) as c:
                with pytest.raises(NotAReader):
                    await c.call("POST", "/step", forged, response=HeartbeatAck)
            # the same bytes signed by the node but claiming the trainer's address
            forged_raw = forged.model_dump_json().encode()
            claimed = sign_request(key("n2"), "POST", "/step", forged_raw,
                                   audience=await _audience(s.url),
                                   address=address("trainer")).as_dict()
            with pytest.raises(WrongSigner):
                await _raw(s.url, forged_raw, claimed)
            # the trainer's request replayed as it was: its nonce was used
            with pytest.raises(ReplayedNonce):
                await _raw(s.url, body, signed)
            # the trainer's key but values out of range
            async with SignedClient(s.url, key("trainer")) as c:
                with pytest.raises(TakenBeyondAccepted) as beyond:
                    await c.call("POST", "/step", StepUpdate(step=5, taken_through=2, ahead=2),
                                 response=HeartbeatAck)
                assert "last acceptance number is 1" in str(beyond.value)
                for raw in ({"step": 5, "taken_through": -1, "ahead": 2},
                            {"step": 5, "taken_through": 0, "ahead": (1 << 20) + 1},
                            {"step": 5, "taken_through": 0, "ahead": -3},
                            {"step": -1, "taken_through": 0, "ahead": 2},
                            {"step": 5, "taken_through": "all", "ahead": 2}):
                    with pytest.raises(InvalidBody):
                        await c.call("POST", "/step", raw, response=HeartbeatAck)
                with pytest.raises(StepGoesBack):
                    await c.call("POST", "/step", StepUpdate(step=3, taken_through=1, ahead=9),
                                 response=HeartbeatAck)
            assert seen() == before
            # members are told what they were told before
            assert [(await _want(s.url, n)).files_wanted for n in NODES] == wanted
            # and the trainer's next true word still moves it
            await _step(s.url, 5, 1, 2)
            assert seen()[:2] == (5, (1, 2))
    asyncio.run(t())


async def _held_want(url: str, node: str, wait: float, version: int | None = None
                     ) -> tuple[WorkOrder, float]:
    """`GET /work?wait=` and how long its answer took."""
    query: dict[str, float | int] = {"wait": wait}
    if version is not None:
        query["version"] = version
    async with SignedClient(url, key(node)) as c:
        t0 = time.monotonic()
        order = await c.call("GET", "/work", response=WorkOrder, query=query)
        return order, time.monotonic() - t0


@pytest.mark.timing
def test_a_held_work_order_is_answered_when_the_trainer_wants_more(tmp_path: Path) -> None:
    """`wait=S`: while the demand is met the request is held, and answered as soon as the
    trainer's next word wants a file (not at the next poll); with nothing new it is answered
    after S with no file. A node that must fetch a newer version is told at once."""
    async def t() -> None:
        async with api_from_parts(tmp_path, _cfg(), readers=(address("trainer"),)) as s:
            await _members_beating(s)
            await _step(s.url, 3, 0, 1)
            assert (await _want(s.url, "n1")).files_wanted == 1
            await _grant(s.url, "n1", 3, 0)
            # nothing new: held for the whole wait, then no file
            order, took = await _held_want(s.url, "n2", 0.6)
            assert order.files_wanted == 0 and "demand is met" in order.waiting
            assert 0.55 <= took < 3.0, took
            # held, then the trainer moves and wants two more: answered at once
            held = asyncio.create_task(_held_want(s.url, "n2", 10.0))
            await asyncio.sleep(0.5)
            assert not held.done()
            await _step(s.url, 3, 0, 3)
            order, took = await held
            assert order.files_wanted == 1 and order.step == 3
            assert 0.5 <= took < 1.5, took
            # a node whose version the pool no longer takes waits for nothing: told at once,
            # and the version its work order names is the one the pool judges it by
            order, took = await _held_want(s.url, "n3", 10.0, version=1)
            assert order.files_wanted == 0 and "fetch a newer one" in order.waiting
            assert took < 2.0, took
            node = s.state.node(address("n3"))
            assert node is not None and node.policy_version == 1
            order, _ = await _held_want(s.url, "n3", 10.0, version=3)
            assert order.files_wanted == 1
            # the oldest version the pool takes (2, at step 3 with async_level 1) makes files
            # only the step being filled could use: told at once to fetch a newer one
            order, took = await _held_want(s.url, "n3", 10.0, version=2)
            assert order.files_wanted == 0 and "oldest the pool takes" in order.waiting
            assert took < 2.0, took
            # a wait beyond the bound, or not a finite number, is refused as the query it is
            async with SignedClient(s.url, key("n1")) as c:
                for bad in ({"wait": 31}, {"wait": "nan"}, {"wait": -1}, {"version": -2}):
                    with pytest.raises(InvalidQuery):
                        await c.call("GET", "/work", response=WorkOrder, query=bad)
    asyncio.run(t())


@pytest.mark.timing
def test_a_held_ledger_read_is_answered_at_the_next_acceptance(tmp_path: Path) -> None:
    """The trainer's `GET /ledger?accepted_after=N&wait=S` returns when a file is accepted,
    not at its next poll; the orchestrator caps the hold at `work.max_hold_s`."""
    cfg = _cfg().model_copy(update={"work": _cfg().work.model_copy(update={"max_hold_s": 1.0})})

    async def read(url: str, wait: float) -> tuple[LedgerPage, float]:
        async with SignedClient(url, key("trainer")) as c:
            t0 = time.monotonic()
            page = await c.call("GET", "/ledger", response=LedgerPage,
                                query={"accepted_after": 0, "wait": wait})
            return page, time.monotonic() - t0

    async def t() -> None:
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            await _members_beating(s)
            sha = await _grant(s.url, "n1", 3, 0)
            page, took = await read(s.url, 20.0)  # capped at 1 s
            assert page.entries == [] and 0.95 <= took < 3.0, took
            held = asyncio.create_task(read(s.url, 20.0))
            await asyncio.sleep(0.3)
            row = s.state.file(sha)
            assert row is not None
            s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
            page, took = await held
            assert [e.sha256 for e in page.entries] == [sha] and took < 0.9, took
    asyncio.run(t())


def test_a_waiting_trainer_takes_a_file_at_its_acceptance_not_its_next_poll(
        tmp_path: Path) -> None:
    """`network.hold_s`: a step short of files reads the accepted feed held by the orchestrator,
    so a file accepted meanwhile is taken at once; polling every `poll_s` (5 s here) would
    have taken it seconds later. With `hold_s = 0` it is the poll that finds it."""
    from meshrl.rl.config import NetworkSourceConfig, RolloutConfig
    from meshrl.rl.network_source import NetworkSource

    key_file = tmp_path / "trainer.key"
    key_file.write_text(key("trainer"))

    async def upload(url: str, node: str, counter: int) -> str:
        data = parquet_framed(os.urandom(64))
        sha = hashlib.sha256(data).hexdigest()
        path = tmp_path / f"{sha}.parquet"
        path.write_bytes(data)
        async with SignedClient(url, key(node)) as c:
            slot = await c.call("POST", "/uploads", SlotRequest(
                sha256=sha, size=len(data), policy_version=3, work_units=10,
                counter=counter), response=UploadSlot)
            await c.upload("PUT", slot.url, path, sha)
        return sha

    async def taken_after_acceptance(s: Served, hold_s: float, counter: int) -> float:
        cfg = NetworkSourceConfig(orchestrator_url=s.url, key_file=str(key_file), poll_s=5.0,
                                  hold_s=hold_s)
        src = await asyncio.to_thread(
            NetworkSource, cfg, RolloutConfig(group_size=2, prompts_per_step=16), 1, 3,
            tmp_path / f"run{counter}", (None, None))
        src.reader.after = s.state.last_accepted_seq()
        src.ahead = None  # no demand said: the wait is the read's alone
        sha = await upload(s.url, "n1", counter)
        waiting = asyncio.create_task(asyncio.to_thread(src._fresh, 3, 1, [], [], True))
        await asyncio.sleep(1.0)  # the step is waiting now (its first, unheld read was empty)
        assert not waiting.done()
        row = s.state.file(sha)
        assert row is not None
        t0 = time.monotonic()
        s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
        (got,) = await waiting
        assert got.sha256 == sha
        src.close()
        return time.monotonic() - t0

    async def t() -> None:
        (tmp_path / "run0").mkdir()
        (tmp_path / "run1").mkdir()
        cfg = _cfg().model_copy(update={"rules": _cfg().rules.model_copy(
            update={"group_size": 2})})
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            await _members_beating(s)
            held = await taken_after_acceptance(s, 3.0, 0)
            polled = await taken_after_acceptance(s, 0.0, 1)
            assert held < 0.8, held
            assert polled > 2.0, polled
    asyncio.run(t())


def test_a_node_whose_files_would_arrive_stale_is_wanted_none(tmp_path: Path) -> None:
    """Turnaround: the pool measures each node's lag (its steps from the work order that wanted
    a file to the trainer taking it, `taken_through`) and wants a file from it only while the
    version it holds will still be taken by then: told to fetch a newer one when that helps,
    told its lag exceeds the slack when even the newest would arrive stale. A node not measured
    (a near one, a new one) is wanted files as before, and a far node's lags count only for
    `turnaround_window_s`, after which it is measured again; with the rule off nothing changes."""
    cfg = _cfg().model_copy(update={
        "rules": _cfg().rules.model_copy(update={"async_level": 4, "files_per_step": 8}),
        "work": _cfg().work.model_copy(update={"turnaround_orders": True})})

    async def t() -> None:
        async with api_from_parts(tmp_path, cfg, readers=(address("trainer"),)) as s:
            await _members_beating(s)
            await _step(s.url, 3, 0, 8)
            # n1 (far) makes three files of version 3, ordered at step 3
            shas = []
            for counter in range(3):
                assert (await _want(s.url, "n1")).files_wanted == 1
                shas.append(await _grant(s.url, "n1", 3, counter))
            for sha in shas:
                row = s.state.file(sha)
                assert row is not None
                s.state.set_file_status(row.seq, FileStatus.ACCEPTED)
            last = s.state.file(shas[-1])
            assert last is not None
            # ... and the trainer takes them only for step 8: a lag of 5 steps each
            for step in range(4, 9):
                await _step(s.url, step, 0, 8)
            assert s.api.pacer.lag(address("n1"), time.monotonic()) is None  # none taken yet
            await _step(s.url, 9, last.accepted_seq, 8)
            assert s.api.pacer.lag(address("n1"), time.monotonic()) == 5
            # at step 9 (versions 5..9): even n1's file of version 9 would arrive at step 14,
            # past 9 + 4; no newer version helps
            for n in NODES:
                await _beat(s.url, n, 9)
            newest = await _want(s.url, "n1")
            assert newest.files_wanted == 0 and "more than the pool's slack" in newest.waiting
            assert not s.api.pacer.want(address("n1"), time.monotonic()).must_fetch
            # holding version 6 it is told to fetch (its file would arrive after step 10)
            await _beat(s.url, "n1", 6)
            old = s.api.pacer.want(address("n1"), time.monotonic())
            assert old.files == 0 and old.must_fetch and "after step 10" in old.why, old.why
            # n2, never measured, on the same version: wanted as before
            await _beat(s.url, "n2", 6)
            assert (await _want(s.url, "n2")).files_wanted == 1
            # with the rule off, a measured lag refuses nothing
            await _beat(s.url, "n1", 9)
            s.api.pacer.turnaround = False
            assert s.api.pacer.want(address("n1"), time.monotonic()).files == 1
            s.api.pacer.turnaround = True
            # n1's lags are forgotten after the window: it is measured again
            later = time.monotonic() + cfg.work.turnaround_window_s + 1
            assert s.api.pacer.want(address("n1"), later).files == 1
    asyncio.run(t())
