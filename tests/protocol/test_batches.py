"""Work submitted in batches (issue 46): a node's files committed as one Merkle root, judged
per leaf with its proof, claimed per batch. Each attack on leaves of the issue is played
against the contracts (eth-tester and anvil); numbers are asserted: stakes, rewards, gas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from meshrl.protocol import Standing, WorkStatus
from meshrl.protocol.batches import Batch, Leaf, merkle_proof, merkle_root, verify_proof

from .helpers import PARAMS, RATE, World, file_hash
from .test_disputes import DISPUTE, LOCK, VB, Court, _court, _fresh

HARD, SOFT = WorkStatus.HARD_INVALIDATED, WorkStatus.SOFT_INVALIDATED
PENALTY = PARAMS.slash_penalty


def _leaves(node: str, label: str, n: int, units: int = 3) -> list[Leaf]:
    return [Leaf(node, file_hash(f"{label}-{i}"), units, step=7, counter=i) for i in range(n)]


def _submit(w: World, p, node: str, label: str, n: int, units: int = 3) -> Batch:
    batch, r = p.submit_leaves(w.pool, _leaves(node, label, n, units))
    assert r.event("BatchSubmitted").args["batch_id"] == batch.id
    return batch


def _open(v, batch: Batch, i: int, verdict: int = 0, proof: list[bytes] | None = None):
    return v.open_leaf(batch.root, i, batch.leaves[i],
                       batch.proof(i) if proof is None else proof, verdict)


def _stake(w: World, p) -> int:
    return w.fed.provider(p.address).stake


def test_the_tree_the_client_builds_is_the_one_it_proves() -> None:
    for n in (1, 2, 3, 5, 8, 9):
        hashes = [Leaf("0x" + "11" * 20, file_hash(f"t{i}"), 1).hash() for i in range(n)]
        root = merkle_root(hashes)
        for i in range(n):
            proof = merkle_proof(hashes, i)
            assert len(proof) == (n - 1).bit_length()
            assert verify_proof(hashes[i], i, n, proof, root)
            assert not verify_proof(hashes[i], i ^ 1, n, proof, root) or n == 1
        assert not verify_proof(hashes[0], 0, n, [*merkle_proof(hashes, 0), root], root)
    with pytest.raises(ValueError):
        Batch.of([Leaf("0x" + "11" * 20, file_hash("a"), 1), Leaf("0x" + "22" * 20,
                                                                   file_hash("b"), 1)])


def test_an_honest_batch_is_claimed_in_one_item(world: World) -> None:
    w, p1, n1 = world, world.p1, world.n1.address
    batch = _submit(w, p1, n1, "honest", 5)
    info = w.fed.work(batch.id)
    assert (info.count, info.units, info.reward, info.status) == (5, 15, 15 * RATE,
                                                                   WorkStatus.SUBMITTED)
    assert w.fed.contract.functions.pool_work_units(w.pool).call() == 15
    w.expect_revert("work: locked", lambda: p1.claim_batch([batch.id]))
    w.backend.advance_time(PARAMS.lock_period + 1)
    assert w.fed.claimable(batch.id)
    r = p1.claim_batch([batch.id])
    assert r.event("RewardsClaimed").args["amount"] == 15 * RATE
    # claim twice
    w.expect_revert("work: already claimed", lambda: p1.claim_batch([batch.id]),
                    check_funds=True)
    # its stake could not leave before the batch's window closed
    assert w.fed.contract.functions.judgeable_until(p1.address).call() == info.judge_until


def test_claim_gas_does_not_grow_with_the_batch(world: World) -> None:
    w, p1, n1 = world, world.p1, world.n1.address
    small, big = _submit(w, p1, n1, "small", 2), _submit(w, p1, n1, "big", 256)
    w.backend.advance_time(PARAMS.lock_period + 1)
    snap = w.backend.snapshot()
    g_small = p1.claim_batch([small.id]).gas_used
    w.backend.revert(snap)
    g_big = p1.claim_batch([big.id]).gas_used
    assert abs(g_small - g_big) < 100  # the amounts differ, not the work


def test_a_fraudulent_leaf_is_slashed_and_honest_neighbours_are_paid(world: World) -> None:
    """p2's node n3 cheats in leaf 2 of its batch; p1's batch and p1's leaves are paid. The
    upheld hard verdict wipes n3's unchecked work, its batch included, exactly as per file."""
    w, p1, p2 = world, world.p1, world.p2
    p2.join_pool(*w.invite(w.pool, w.n3.address, nonce=7))
    honest = _submit(w, p1, w.n1.address, "honest", 4)
    cheat = _submit(w, p2, w.n3.address, "cheat", 4)
    stake = _stake(w, p2)
    r = _open(w.validator, cheat, 2, HARD)
    opened = r.event("LeafOpened").args
    wid = cheat.leaves[2].work_id
    assert (opened["work_id"], opened["units"], opened["copy"]) == (wid, 3, False)
    assert w.fed.work(wid).status == HARD and _stake(w, p2) == stake - PENALTY
    assert w.fed.standing(cheat.id) == Standing.WIPED
    assert w.fed.work(cheat.id).units == 9  # the leaf left the batch
    w.backend.advance_time(PARAMS.lock_period + 1)
    w.expect_revert("work: rewards wiped", lambda: p2.claim_batch([cheat.id]), check_funds=True)
    assert p1.claim_batch([honest.id]).event("RewardsClaimed").args["amount"] == 12 * RATE


def test_a_soft_leaf_leaves_its_batch_mates_paid(world: World) -> None:
    w, p1 = world, world.p1
    batch = _submit(w, p1, w.n1.address, "mixed", 6)
    _open(w.validator, batch, 1, SOFT)
    _open(w.validator, batch, 4)  # opened, no verdict: a valid item of its own
    assert w.fed.work(batch.leaves[1].work_id).status == SOFT
    assert w.fed.work(batch.leaves[4].work_id).status == WorkStatus.SUBMITTED
    w.backend.advance_time(PARAMS.lock_period + 1)
    w.expect_revert("work: invalidated", lambda: p1.claim([batch.leaves[1].work_id]))
    got = p1.claim([batch.id, batch.leaves[4].work_id]).event("RewardsClaimed").args["amount"]
    assert got == 15 * RATE  # six leaves of 3 units, less the soft one's


def test_a_leaf_proven_against_another_batch_is_refused(world: World) -> None:
    w, p1, p2 = world, world.p1, world.p2
    p2.join_pool(*w.invite(w.pool, w.n3.address, nonce=7))
    a = _submit(w, p1, w.n1.address, "a", 4)
    b = _submit(w, p1, w.n1.address, "b", 4)
    c = _submit(w, p2, w.n3.address, "c", 4)
    v = w.validator
    # a's leaf and proof, against b's root
    w.expect_revert("work: bad proof", lambda: v.open_leaf(b.root, 1, a.leaves[1], a.proof(1)))
    # a's leaf (node n1) against c's root: no batch of n1 has that root
    w.expect_revert("work: not pending", lambda: v.open_leaf(c.root, 1, a.leaves[1], a.proof(1)))
    # the right proof at the wrong index
    w.expect_revert("work: bad proof", lambda: v.open_leaf(a.root, 2, a.leaves[1], a.proof(1)))
    # a per-file item is no batch
    p1.submit_work(w.pool, w.n1.address, file_hash("single"), 3)
    single = Leaf(w.n1.address, file_hash("single"), 3)
    w.expect_revert("work: not pending",
                    lambda: v.open_leaf(file_hash("single"), 0, single, []))


def test_wrong_proof_lengths_indices_and_verdicts_are_refused(world: World) -> None:
    w, v = world, world.validator
    batch = _submit(w, w.p1, w.n1.address, "len", 5)  # depth 3
    proof = batch.proof(3)
    w.expect_revert("work: bad proof", lambda: _open(v, batch, 3, proof=proof[:2]))
    w.expect_revert("work: bad proof", lambda: _open(v, batch, 3, proof=[*proof, proof[0]]))
    # index past the count (the tree's padding)
    pad = Leaf(w.n1.address, bytes(32), 0)
    w.expect_revert("work: bad leaf", lambda: v.open_leaf(batch.root, 5, pad, proof))
    # a tree deeper than its count says: a leaf below the declared depth is no leaf of it
    deep = Batch.of(_leaves(w.n1.address, "deep", 4))
    w.p1.submit_batch(w.pool, w.n1.address, deep.root, 2, 6)
    w.expect_revert("work: bad proof", lambda: _open(v, deep, 1))
    w.expect_revert("work: bad verdict", lambda: _open(v, batch, 3, 1))
    w.expect_revert("roles: not validator", lambda: _open(w.stranger, batch, 3))
    _open(v, batch, 3)
    w.expect_revert("work: bad leaf", lambda: _open(v, batch, 3, HARD))  # each leaf once


def test_a_file_in_two_batches_is_paid_once_and_the_copy_accused(world: World) -> None:
    w, p1, v = world, world.p1, world.validator
    leaves = _leaves(w.n1.address, "dup", 3)
    a, _ = p1.submit_leaves(w.pool, leaves)
    b, _ = p1.submit_leaves(w.pool, [leaves[1], *_leaves(w.n1.address, "other", 2)])
    assert a.id != b.id  # the chain cannot see the copy at submission
    _open(v, a, 1)  # the file's own item
    stake = _stake(w, p1)
    r = _open(v, b, 0, HARD)  # the copy: void in b, and b accused
    ev = r.event("LeafOpened").args
    assert (ev["work_id"], ev["copy"], ev["units"]) == (leaves[1].work_id, True, 3)
    assert w.fed.work(b.id).status == HARD and w.fed.work(b.id).units == 6
    assert _stake(w, p1) == stake - PENALTY
    assert w.fed.contract.functions.pool_work_units(w.pool).call() == 9  # a's only
    # the upheld hard verdict on b wipes the node's unchecked work (a too), as per file
    assert w.fed.standing(a.id) == Standing.WIPED


def test_a_file_twice_in_one_batch_is_paid_once(world: World) -> None:
    w, p1, v = world, world.p1, world.validator
    leaf = Leaf(w.n1.address, file_hash("twice"), 4)
    hashes = [leaf.hash(), leaf.hash()]
    root = merkle_root(hashes)
    p1.submit_batch(w.pool, w.n1.address, root, 2, 8)
    v.open_leaf(root, 0, leaf, merkle_proof(hashes, 0))
    r = v.open_leaf(root, 1, leaf, merkle_proof(hashes, 1), SOFT)
    assert r.event("LeafOpened").args["copy"]
    bid = w.fed.batch_id(w.n1.address, root)
    assert w.fed.work(bid).status == SOFT and w.fed.work(bid).units == 0
    w.backend.advance_time(PARAMS.lock_period + 1)
    assert p1.claim([leaf.work_id]).event("RewardsClaimed").args["amount"] == 4 * RATE


def test_a_batch_whose_count_or_units_lie(world: World) -> None:
    w, p1, v, n1 = world, world.p1, world.validator, world.n1.address
    w.manager.set_pool_limits(w.pool, 10)
    root = file_hash("root")
    w.expect_revert("work: units above pool maximum",
                    lambda: p1.submit_batch(w.pool, n1, root, 4, 41), check_funds=True)
    w.expect_revert("work: bad count", lambda: p1.submit_batch(w.pool, n1, root, 0, 1))
    w.expect_revert("work: bad count", lambda: p1.submit_batch(w.pool, n1, root, 2**16 + 1, 1))
    # leaves that claim more than their batch has take at most what is left
    greedy = Batch.of([Leaf(n1, file_hash("g0"), 9), Leaf(n1, file_hash("g1"), 9)])
    p1.submit_batch(w.pool, n1, greedy.root, 2, 10)
    _open(v, greedy, 0)
    assert _open(v, greedy, 1).event("LeafOpened").args["units"] == 1
    assert w.fed.work(greedy.id).units == 0
    # a total above its leaves' (within the bound): the leaf list shows it, the batch is accused
    batch = Batch.of(_leaves(n1, "lie", 4, units=2))
    p1.submit_batch(w.pool, n1, batch.root, 4, 40)
    stake = _stake(w, p1)
    v.hard_invalidate(batch.id)
    assert _stake(w, p1) == stake - PENALTY and w.fed.work(batch.id).status == HARD


def test_a_root_that_commits_to_a_file_never_uploaded_is_accused(world: World) -> None:
    """The chain cannot see uploads: the validator opens the missing file's leaf (the leaf
    list came with the batch) with a hard verdict, 'unavailable'; a batch whose leaf list
    never came is accused whole."""
    w, p1, v = world, world.p1, world.validator
    batch = _submit(w, p1, w.n1.address, "ghost", 3)
    hidden = Batch.of(_leaves(w.n1.address, "hidden", 3))
    w.p1.submit_batch(w.pool, w.n1.address, hidden.root, 3, 9)
    stake = _stake(w, p1)
    _open(v, batch, 2, HARD)
    assert w.fed.work(batch.leaves[2].work_id).status == HARD
    assert _stake(w, p1) == stake - PENALTY
    w.validator.hard_invalidate(hidden.id)
    assert w.fed.work(hidden.id).status == HARD


def test_a_verdict_on_a_leaf_whose_window_closed_is_refused(world: World) -> None:
    w, v = world, world.validator
    batch = _submit(w, w.p1, w.n1.address, "late", 2)
    w.backend.advance_time(PARAMS.invalidation_window + 1)
    w.expect_revert("work: invalidation window closed", lambda: _open(v, batch, 0, HARD),
                    check_funds=True)
    w.expect_revert("work: invalidation window closed", lambda: _open(v, batch, 0))


def test_a_batch_counts_as_its_files_against_the_submission_interval(world: World) -> None:
    w, p1 = world, world.p1
    w.manager.set_pool_limits(w.pool, 10**6, 60)
    _submit(w, p1, w.n1.address, "first", 4)
    w.backend.advance_time(60 * 3)
    w.expect_revert("work: too frequent",
                    lambda: p1.submit_leaves(w.pool, _leaves(w.n1.address, "next", 1)))
    w.backend.advance_time(61)
    _submit(w, p1, w.n1.address, "next", 1)


def test_the_extension_called_directly_does_nothing(world: World) -> None:
    w = world
    ext = w.fed.contract.functions.EXTENSION().call()
    batch = Batch.of(_leaves(w.n1.address, "direct", 2))
    direct = w.backend.w3.eth.contract(address=ext, abi=w.fed.contract.abi)
    fn = direct.functions.submit_batch(w.pool, w.n1.address, batch.root, 2, 6)
    w.backend.preflight = False
    try:
        with pytest.raises(Exception, match="not node provider"):
            w.p1._send(fn)
    finally:
        w.backend.preflight = True


# disputes on a leaf: the verdict game per leaf, as per file


@pytest.fixture(scope="module", params=["eth-tester", pytest.param("anvil",
                                                                      marks=pytest.mark.anvil)])
def leaf_court(request: pytest.FixtureRequest) -> Court:
    if request.param == "anvil":
        return _court(request.getfixturevalue("anvil_backend"))
    from meshrl.protocol import EthTesterBackend

    return _court(EthTesterBackend())


@pytest.fixture
def c(leaf_court: Court) -> Iterator[Court]:
    yield from _fresh(leaf_court)


def test_a_rogue_verdict_on_an_honest_leaf_is_overturned(c: Court) -> None:
    w, p1 = c.w, c.w.p1
    batch = _submit(w, p1, w.n1.address, "honest", 4)
    stake = _stake(w, p1)
    wid = batch.leaves[3].work_id
    _open(c.rogue, batch, 3, HARD)
    assert w.fed.standing(batch.id) == Standing.DISPUTED
    c.judge.vote(wid, False)  # overturn: also a challenge
    w.backend.advance_time(DISPUTE + 1)
    assert w.fed.settle(wid).event("VerdictOverturned").args["forfeited"] == VB
    assert _stake(w, p1) == stake + VB
    w.backend.advance_time(LOCK)
    got = p1.claim([batch.id, wid]).event("RewardsClaimed").args["amount"]
    assert got == 12 * RATE  # the whole batch, the leaf included


def test_a_caught_leaf_challenged_and_upheld_wipes_its_batch(c: Court) -> None:
    w, p1, p2 = c.w, c.w.p1, c.w.p2
    honest = _submit(w, p1, w.n1.address, "honest", 3)
    cheat = _submit(w, p2, w.n3.address, "cheat", 3)
    wid = cheat.leaves[0].work_id
    stake = _stake(w, p2)
    _open(c.rogue, cheat, 0, HARD)
    p2.challenge(wid)
    c.judge.vote(wid, True)
    w.expect_revert("work: dispute open", lambda: w.fed.settle(wid))
    w.backend.advance_time(DISPUTE + 1)
    assert w.fed.settle(wid).event("WorkInvalidated").args["slashed"] == PENALTY
    assert _stake(w, p2) == stake - PENALTY - VB // 2  # the deposit went to the accuser
    assert w.fed.standing(cheat.id) == Standing.WIPED
    w.backend.advance_time(LOCK)
    w.expect_revert("work: rewards wiped", lambda: p2.claim([cheat.id]))
    assert p1.claim([honest.id]).event("RewardsClaimed").args["amount"] == 9 * RATE


def test_a_protocol_whose_extension_is_not_ours_is_refused(world: World) -> None:
    """The extension runs on the protocol's storage: a pool whose protocol code is ours but
    whose extension is another contract (here the token) could move stake; a stranger's
    `check_contracts` refuses it."""
    from eth_utils import keccak

    from meshrl.protocol.chain import _deploy_one
    from meshrl.protocol.verify import ContractMismatch, check_contracts

    w, b, p = world, world.backend, PARAMS
    token = w.fed.token.address

    def hashes(protocol: str) -> dict[str, str]:
        return {n: "0x" + keccak(bytes(b.w3.eth.get_code(a))).hex()
                for n, a in (("token", token), ("protocol", protocol))}

    ours = w.fed.contract.address
    check_contracts(b, b.chain_id, {"token": token, "protocol": ours}, hashes(ours))
    forged, _ = _deploy_one(b, w.n2, "protocol", token, token, p.min_stake, p.stake_per_unit,
                            p.unbonding_delay, p.invalidation_window, p.lock_period,
                            p.slash_penalty, p.verdict_bond, p.dispute_period, p.vote_period,
                            p.quorum)
    with pytest.raises(ContractMismatch, match="extension"):
        check_contracts(b, b.chain_id, {"token": token, "protocol": forged}, hashes(forged))
