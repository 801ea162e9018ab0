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


def test_batched_reads_answer_as_web3_does(world: World) -> None:
    """`call_many` encodes view calls itself (viewcall.py); every answer equals web3's own
    `fn.call()`: structs as tuples with checksummed addresses, booleans, enums, balances,
    a bytes32 that names nothing (zeros), an address (node_info)."""
    from meshrl.protocol.viewcall import view_call

    ids = [bytes.fromhex(_submit(world, f"r{i}", 3 + i)) for i in range(3)]
    world.validator.hard_invalidate(ids[1])
    f = world.fed.contract.functions
    fns = [*(g(w) for w in [*ids, b"\0" * 32] for g in (f.work_info, f.claimable, f.standing)),
           f.node_info(world.n1.address), f.blacklisted(world.pool, world.n1.address),
           world.fed.token.functions.balanceOf(world.p1.address)]
    assert all(view_call(fn) is not None for fn in fns)
    got = world.backend.call_many(fns, chunk=4)
    assert got == [fn.call() for fn in fns]
    assert got[0][1] == world.n1.address  # checksummed, as web3 hands it back
    if hasattr(world.backend.w3.provider, "make_batch_request"):  # anvil: one batch per 4
        assert world.backend._raw_batch([view_call(fn) for fn in fns[:4]]) == got[:4]


def test_events_decode_as_web3_does(world: World) -> None:
    """The decoder reads arguments with eth-abi itself; every log of a pool's life (stakes,
    joins, submissions, a slash and ejection, claims, token transfers) decodes to what web3's
    own `process_log` makes of it."""
    claimed = _submit(world, "paid", 10)
    world.backend.advance_time(LOCK + 1)
    world.p1.claim([bytes.fromhex(claimed)])
    world.validator.hard_invalidate(bytes.fromhex(_submit(world, "bad", 4)))
    dec = world.fed.decoder
    logs = world.backend.w3.eth.get_logs({"address": [world.fed.token.address,
                                                      world.fed.contract.address],
                                          "fromBlock": 0, "toBlock": "latest"})
    names = set()
    for log in logs:
        ev, lay = dec._by_key[(log["address"].lower(), bytes(log["topics"][0]))]
        assert lay.ok
        want = ev.process_log(log)
        got = dec.decode(log)
        assert got is not None and (got.name, got.args) == (want["event"], dict(want["args"]))
        names.add(got.name)
    assert {"WorkSubmitted", "WorkInvalidated", "NodeEjected", "RewardsClaimed",
            "Transfer"} <= names, names
