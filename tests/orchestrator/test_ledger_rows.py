"""Every submission on chain gets a ledger row of its own: a node that submits a file granted to
another node (the `copy` cheat) shows up under its own address, is judged by work id and follows
the chain's invalidation, while the original keeps its row. The trainer's pool reader never
takes such a row, nor a file twice. Real orchestrator and anvil processes."""

from __future__ import annotations

import asyncio
import json

import pytest

from meshrl.pool import PoolRulesError
from meshrl.rl.config import NetworkSourceConfig, RolloutConfig
from meshrl.rl.network_source import NetworkSource
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.wire import (
    NoSuchSubmission,
    NotAwaitingVerdict,
    SignedClient,
    WireHTTPError,
    WorkIdOfAnotherFile,
)
from meshrl.wire.models import FileStatus, LedgerEntry, LedgerPage, Verdict, VerdictAck

from .conftest import Pool
from .net import Heartbeater, onboard, run, wait_for
from .test_flow import make_file, upload

pytestmark = pytest.mark.anvil


async def _rows(c: SignedClient, sha: str) -> list[LedgerEntry]:
    page = await c.call("GET", "/ledger", query={"sha256": sha}, response=LedgerPage)
    return page.entries


def _source(pool: Pool, tmp, start_step: int) -> NetworkSource:  # type: ignore[no-untyped-def]
    key = tmp / "trainer.key"
    key.write_text(pool.key("trainer"))
    cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key), poll_s=0.1)
    # the trainer's rollout shape is the pool's published one (group size 2, async level 1)
    return NetworkSource(cfg, RolloutConfig(group_size=2), 1, start_step, tmp, (None, None))


def _take_all(src: NetworkSource) -> list[LedgerEntry]:
    out = []
    while (e := src.take()) is not None:
        out.append(e)
    return out


def test_copied_file_gets_its_own_row_and_is_never_trained_on(pool: Pool, tmp_path) -> None:
    c = pool.chain
    n1, n5 = c.accounts["n1"].address, c.accounts["n5"].address
    (px, x, _), (py, y, _) = make_file(pool, "x.parquet", 11), make_file(pool, "y.parquet", 12)

    async def t() -> None:
        await onboard(c, pool.disc.url, pool.orch.url, "n5", "p2")
        beats = Heartbeater(pool.orch.url, [pool.key("n5")], every=0.3)
        try:
            async with SignedClient(pool.orch.url, pool.key("n1")) as node, \
                    SignedClient(pool.orch.url, pool.key("val")) as val, \
                    SignedClient(pool.orch.url, pool.key("trainer")) as trainer:
                await judge(node, val, trainer)
        finally:
            beats.stop()

    async def judge(node: SignedClient, val: SignedClient, trainer: SignedClient) -> None:
        for path, sha in ((px, x), (py, y)):
            await upload(node, path, sha)
            await asyncio.to_thread(c.client("p1").submit_work, c.pool, n1, bytes.fromhex(sha), 54)
            # n5 (another provider) submits the same file as its own work, never granted it
            await asyncio.to_thread(c.client("p2").submit_work, c.pool, n5, bytes.fromhex(sha), 54)

        async def both_submitted() -> bool:
            rows = [*await _rows(trainer, x), *await _rows(trainer, y)]
            return len(rows) == 4 and all(r.status == FileStatus.SUBMITTED for r in rows)
        await wait_for(both_submitted)
        rows = {(r.sha256, r.node): r for s in (x, y) for r in await _rows(trainer, s)}
        orig, copy = rows[(x, n1)], rows[(x, n5)]
        assert (orig.granted, orig.uploaded, copy.granted, copy.uploaded) == (True, True, False,
                                                                              False)
        assert copy.work_id == c.fed.work_id(n5, bytes.fromhex(x)).hex() != orig.work_id
        assert (copy.policy_version, copy.work_units, copy.provider.lower()) == (
            orig.policy_version, 54, c.accounts["p2"].address.lower())
        # verdicts address a submission by work id; the copy of y is (wrongly) accepted first
        for key, kind in (((y, n5), "accept"), ((y, n1), "accept"), ((x, n5), "hard_invalid")):
            r = rows[key]
            ack = await val.call("POST", "/verdicts", Verdict(
                sha256=r.sha256, verdict=kind, work_id=r.work_id), response=VerdictAck)
            assert (ack.work_id, ack.status) == (r.work_id, FileStatus.ACCEPTED if kind ==
                                                 "accept" else FileStatus.SUBMITTED)
        ack = await val.call("POST", "/verdicts", Verdict(sha256=x, verdict="accept"),
                             response=VerdictAck)  # no work id: the file's granted row
        assert (ack.work_id, ack.status) == (orig.work_id, FileStatus.ACCEPTED)
        await refused(val, Verdict(sha256=y, verdict="accept", work_id=copy.work_id),
                      WorkIdOfAnotherFile)
        await refused(val, Verdict(sha256=x, verdict="accept", work_id="ab" * 32),
                      NoSuchSubmission)
        await asyncio.to_thread(c.client("val").hard_invalidate, bytes.fromhex(copy.work_id))

        async def copy_invalidated() -> bool:
            rs = {r.node: r.status for r in await _rows(trainer, x)}
            return rs == {n1: FileStatus.ACCEPTED, n5: FileStatus.HARD_INVALIDATED}
        await wait_for(copy_invalidated)
        # the row moved on: no verdict is needed any more (a validator stops posting it)
        await refused(val, Verdict(sha256=x, verdict="accept", work_id=copy.work_id),
                      NotAwaitingVerdict)
        assert c.fed.node(n5).pool == 0  # ejected on chain; the original's node is not
        assert c.fed.node(n1).pool == c.pool

    run(t())
    # the trainer's reader: acceptance order, granted rows only, each file once
    src = _source(pool, tmp_path, start_step=0)
    taken = _take_all(src)
    mine = [(e.sha256, e.node) for e in taken if e.sha256 in (x, y)]
    assert mine == [(y, n1), (x, n1)]
    assert all(e.granted and e.uploaded for e in taken)
    assert len({e.sha256 for e in taken}) == len(taken)
    # a trainer resumed after step 0 took them does not take them again; one resumed from
    # step 0 (its record cut) takes them again, once
    used = [{"sha256": e.sha256, "node": e.node, "version": e.policy_version}
            for e in taken]
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(
        {"step": 0, "t": 0.0, "used": used, "dropped": [], "wait_s": 0}) + "\n")
    assert _take_all(_source(pool, tmp_path, start_step=1)) == []
    again = _take_all(_source(pool, tmp_path, start_step=0))
    assert [e.sha256 for e in again] == [e.sha256 for e in taken]


async def refused(c: SignedClient, v: Verdict, refusal: type[WireHTTPError]) -> None:
    try:
        await c.call("POST", "/verdicts", v)
        raise AssertionError(f"verdict taken: {v}")
    except WireHTTPError as e:
        assert type(e) is refusal, e


def test_a_trainer_whose_shape_is_not_the_pools_refuses_to_start(pool: Pool, tmp_path) -> None:
    """The trainer reads files by the published rules: one configured for another group size,
    async level or task refuses before it reads anything, naming the field."""
    key = tmp_path / "trainer.key"
    key.write_text(pool.key("trainer"))
    cfg = NetworkSourceConfig(orchestrator_url=pool.orch.url, key_file=str(key), poll_s=0.1)
    with pytest.raises(PoolRulesError, match=r"trainer's \[rules\] differ from the pool's "
                       r"published rules: rules\.group_size: configured 8, the pool "
                       r"publishes 2"):
        NetworkSource(cfg, RolloutConfig(group_size=8), 1, 0, tmp_path, (None, None))
    with pytest.raises(PoolRulesError, match=r"rules\.async_level: configured 2"):
        NetworkSource(cfg, RolloutConfig(group_size=2), 2, 0, tmp_path, (None, None))
    other = TasksConfig(mix=[ArithmeticConfig(digits=3)])
    with pytest.raises(PoolRulesError, match=r"rules\.task\.mix\.0\.digits: configured 3"):
        NetworkSource(cfg, RolloutConfig(group_size=2), 1, 0, tmp_path, (None, None),
                      tasks=other)
    assert not (tmp_path / "rollouts.jsonl").exists()  # refused before it recorded anything
