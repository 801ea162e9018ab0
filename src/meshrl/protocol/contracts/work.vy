# pragma version ~=0.4.3
"""
@title Work and rewards
@notice A node's provider submits work (pool, node, file sha256, work units). The work item
        is keyed by its work id, keccak256(abi_encode(node, file sha256)): a file is bound to
        the node that submits it, so a copied hash neither blocks the honest submission nor
        passes validation (the rollout file names its node). Units are bounded per file by
        the pool; the provider's stake must cover its nodes to submit or claim. Within the
        invalidation window a validator may hard-invalidate an item (work voided; the locked
        rewards of the node generation the work was done in wiped; the node ejected from the
        work's pool if its provider still has it there; that provider slashed by
        `slash_penalty`) or soft-invalidate it (work voided, no slash). Valid work earns the
        pool's rate per unit (fixed at submission), claimable once after `lock_period`.
@dev Wiping is O(1): it records when a node generation was judged, and every item of that
     generation still locked at that moment is void. A generation ends when the node changes
     provider, is ejected, or is judged, so one judgment never reaches another provider's or
     a later chapter's rewards.
"""

from . import roles
from . import stake
from . import nodes
from . import pools

uses: roles
uses: stake
uses: nodes
uses: pools

interface Mintable:
    def mint(receiver: address, amount: uint256): nonpayable

SUBMITTED: constant(uint8) = 1
SOFT_INVALIDATED: constant(uint8) = 2
HARD_INVALIDATED: constant(uint8) = 3
CLAIMED: constant(uint8) = 4
MAX_CLAIM: constant(uint256) = 64

struct Work:
    pool: uint256
    node: address
    provider: address
    units: uint256
    reward: uint256
    submitted_at: uint256
    unlock_at: uint256
    generation: uint256
    status: uint8

event WorkSubmitted:
    work_id: indexed(bytes32)
    pool: indexed(uint256)
    node: indexed(address)
    file_sha256: bytes32
    units: uint256
    reward: uint256

event WorkInvalidated:
    work_id: indexed(bytes32)
    node: indexed(address)
    hard: bool
    slashed: uint256
    validator: address

event RewardsClaimed:
    provider: indexed(address)
    amount: uint256
    count: uint256

event WorkParamsSet:
    invalidation_window: uint256
    lock_period: uint256
    slash_penalty: uint256


work_info: public(HashMap[bytes32, Work])
generation_wiped_at: public(HashMap[address, HashMap[uint256, uint256]])
last_submission: public(HashMap[address, uint256])
pool_work_units: public(HashMap[uint256, uint256])
total_claimed: public(uint256)
invalidation_window: public(uint256)
lock_period: public(uint256)
slash_penalty: public(uint256)


@deploy
def __init__(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
def submit_work(pool: uint256, node: address, file_sha256: bytes32, units: uint256) -> bytes32:
    """
    @notice Record work done by one of the caller's nodes in an active pool.
    @dev The caller's stake must cover its nodes; the pool may require an interval between
         a node's submissions.
    @param pool The pool the node works for.
    @param node The node that did the work (the rollout file names it).
    @param file_sha256 The sha256 of the rollout file; a node submits each file once.
    @param units The work units claimed, 1..the pool's `max_units`.
    @return The work id, keccak256(abi_encode(node, file_sha256)).
    """
    assert nodes.node_info[node].provider == msg.sender, "work: not node provider"
    assert nodes.node_info[node].pool == pool, "work: node not in pool"
    assert pools.pool_info[pool].status == pools.ACTIVE, "work: pool not active"
    assert units > 0, "work: zero units"
    assert units <= pools.pool_info[pool].max_units, "work: units above pool maximum"
    assert file_sha256 != empty(bytes32), "work: empty hash"
    stake._check_covered(msg.sender)
    interval: uint256 = pools.pool_info[pool].min_interval
    if interval > 0:
        assert block.timestamp >= self.last_submission[node] + interval, "work: too frequent"
        self.last_submission[node] = block.timestamp
    wid: bytes32 = self._work_id(node, file_sha256)
    assert self.work_info[wid].status == 0, "work: duplicate file"
    reward: uint256 = units * pools.pool_info[pool].reward_rate
    self.work_info[wid] = Work(
        pool=pool,
        node=node,
        provider=msg.sender,
        units=units,
        reward=reward,
        submitted_at=block.timestamp,
        unlock_at=block.timestamp + self.lock_period,
        generation=nodes.node_generation[node],
        status=SUBMITTED,
    )
    self.pool_work_units[pool] += units
    log WorkSubmitted(work_id=wid, pool=pool, node=node, file_sha256=file_sha256, units=units, reward=reward)
    return wid


@external
def hard_invalidate(work_id: bytes32) -> uint256:
    """
    @notice Void fraudulent work: wipe the locked rewards of the node generation it was done
            in, eject the node from the work's pool if its provider still has it there, and
            slash the provider that did the work by `slash_penalty`.
    @dev Validators only, within the invalidation window.
    @param work_id The work to void.
    @return The amount slashed.
    """
    w: Work = self._check_invalidation(work_id)
    self.work_info[work_id].status = HARD_INVALIDATED
    self.pool_work_units[w.pool] -= w.units
    # The first judgment of a generation fixes its wipe time: a later one would spare items
    # that unlocked in between.
    if self.generation_wiped_at[w.node][w.generation] == 0:
        self.generation_wiped_at[w.node][w.generation] = block.timestamp
    if nodes.node_info[w.node].provider == w.provider and nodes.node_info[w.node].pool == w.pool:
        pools._eject(w.pool, w.node)  # also ends the generation
    elif w.generation == nodes.node_generation[w.node]:
        nodes._next_generation(w.node)
    slashed: uint256 = stake._slash(w.provider, self.slash_penalty)
    log WorkInvalidated(work_id=work_id, node=w.node, hard=True, slashed=slashed, validator=msg.sender)
    return slashed


@external
def soft_invalidate(work_id: bytes32):
    """
    @notice Void work that is wrong but not fraudulent (e.g. stale); no slash.
    @dev Validators only, within the invalidation window.
    @param work_id The work to void.
    """
    w: Work = self._check_invalidation(work_id)
    self.work_info[work_id].status = SOFT_INVALIDATED
    self.pool_work_units[w.pool] -= w.units
    log WorkInvalidated(work_id=work_id, node=w.node, hard=False, slashed=0, validator=msg.sender)


@external
@nonreentrant
def claim(work_ids: DynArray[bytes32, MAX_CLAIM]) -> uint256:
    """
    @notice Claim the rewards of the caller's unlocked, valid work items (minted to the caller).
    @dev The caller's stake must cover its nodes.
    @param work_ids The work ids of the items; each can be claimed once.
    @return The amount minted.
    """
    stake._check_covered(msg.sender)
    total: uint256 = 0
    for wid: bytes32 in work_ids:
        assert self.work_info[wid].provider == msg.sender, "work: not your work"
        status: uint8 = self.work_info[wid].status
        assert status != CLAIMED, "work: already claimed"
        assert status == SUBMITTED, "work: invalidated"
        unlock_at: uint256 = self.work_info[wid].unlock_at
        assert block.timestamp >= unlock_at, "work: locked"
        node: address = self.work_info[wid].node
        assert not self._wiped(node, self.work_info[wid].generation, unlock_at), "work: rewards wiped"
        self.work_info[wid].status = CLAIMED
        total += self.work_info[wid].reward
    self.total_claimed += total
    log RewardsClaimed(provider=msg.sender, amount=total, count=len(work_ids))
    if total > 0:
        extcall Mintable(stake.token.address).mint(msg.sender, total)
    return total


@external
def set_work_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    """
    @notice Set the invalidation window, reward lock period and hard-invalidation penalty.
    @dev Federator only. The lock may not be shorter than the window, nor the unbonding delay.
    @param invalidation_window Seconds after submission during which validators may invalidate.
    @param lock_period Seconds after submission before a reward is claimable.
    @param slash_penalty Stake slashed on a hard invalidation.
    """
    roles._check_federator()
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
@view
def claimable(work_id: bytes32) -> bool:
    """
    @notice Whether the work item can be claimed now by its provider (stake aside).
    @param work_id The work item.
    @return True when valid, unclaimed, unlocked and not wiped.
    """
    w: Work = self.work_info[work_id]
    return w.status == SUBMITTED and block.timestamp >= w.unlock_at and not self._wiped(w.node, w.generation, w.unlock_at)


@external
@pure
def work_id(node: address, file_sha256: bytes32) -> bytes32:
    """
    @notice The key of the work `node` submits for a file.
    @param node The node that did the work.
    @param file_sha256 The rollout file's sha256.
    @return keccak256(abi_encode(node, file_sha256)).
    """
    return self._work_id(node, file_sha256)


@internal
@pure
def _work_id(node: address, file_sha256: bytes32) -> bytes32:
    return keccak256(abi_encode(node, file_sha256))


@internal
@view
def _wiped(node: address, generation: uint256, unlock_at: uint256) -> bool:
    wiped_at: uint256 = self.generation_wiped_at[node][generation]
    return wiped_at != 0 and unlock_at > wiped_at


@internal
@view
def _check_invalidation(work_id: bytes32) -> Work:
    roles._check_validator()
    w: Work = self.work_info[work_id]
    assert w.status != 0, "work: unknown work"
    assert w.status == SUBMITTED, "work: not pending"
    assert block.timestamp < w.submitted_at + self.invalidation_window, "work: invalidation window closed"
    return w


@internal
def _set_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    assert lock_period >= invalidation_window, "work: lock shorter than window"
    stake._set_min_unbonding_delay(invalidation_window)
    self.invalidation_window = invalidation_window
    self.lock_period = lock_period
    self.slash_penalty = slash_penalty
    log WorkParamsSet(invalidation_window=invalidation_window, lock_period=lock_period, slash_penalty=slash_penalty)
