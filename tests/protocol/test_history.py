"""`pool_history`: a pool's work items as the chain judges and pays them, for reports."""

from __future__ import annotations

from meshrl.protocol.history import pool_history

from .helpers import PARAMS, RATE, World, file_hash

LOCK = PARAMS.lock_period


def _submit(world: World, label: str, units: int) -> str:
    f = file_hash(label)
    world.p1.submit_work(world.pool, world.n1.address, f, units)
    return world.fed.work_id(world.n1.address, f).hex()


def test_rewards_earned_claimable_claimed_and_wiped(world: World) -> None:
    claimed = _submit(world, "claimed", 10)
    world.backend.advance_time(LOCK + 1)
    world.p1.claim([bytes.fromhex(claimed)])
    unlocked = _submit(world, "unlocked", 20)
    world.backend.advance_time(LOCK + 1)
    locked, bad = _submit(world, "locked", 30), _submit(world, "bad", 40)
    world.validator.hard_invalidate(bytes.fromhex(bad))  # wipes `locked`, not `unlocked`

    h = pool_history(world.fed, world.pool)
    works = {w["work_id"]: w for w in h["works"]}
    assert list(works) == [claimed, unlocked, locked, bad]
    assert [(works[w]["status"], works[w]["wiped"], works[w]["claimable"]) for w in works] == [
        ("claimed", False, False), ("submitted", False, True), ("submitted", True, False),
        ("hard_invalidated", False, False)]
    assert works[bad]["file_sha256"] == file_hash("bad").hex()
    node = world.n1.address.lower()
    assert h["rewards"] == {node: {"earned": 30 * RATE, "claimable": 20 * RATE,
                                   "claimed": 10 * RATE}}
    [inv] = h["invalidations"]
    assert (inv["work_id"], inv["hard"], inv["slashed"]) == (bad, True, PARAMS.slash_penalty)
    [ej] = h["ejections"]
    assert ej["node"] == world.n1.address and ej["ts"] >= inv["ts"] - 1
    [paid] = h["claims"]
    assert (paid["provider"], paid["amount"], paid["count"]) == (world.p1.address, 10 * RATE, 1)
    assert h["now"] >= works[bad]["submitted_at"]


def test_other_pools_are_left_out(world: World) -> None:
    wid = _submit(world, "elsewhere", 5)
    assert [w["work_id"] for w in pool_history(world.fed, world.pool)["works"]] == [wid]
    other = pool_history(world.fed, world.pending_pool)
    assert other["works"] == [] and other["rewards"] == {}
