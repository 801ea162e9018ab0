# pragma version ~=0.4.3
"""
@title Work and rewards
@notice A node's provider submits work (pool, node, file sha256, work units). Within the
        invalidation window a validator may hard-invalidate it (work voided, the node's locked
        rewards wiped, the node ejected, the provider slashed by `slash_penalty`) or
        soft-invalidate it (work voided, no slash). Valid work earns the pool's rate per work
        unit (fixed at submission), claimable once after `lock_period`.
@dev A hard invalidation closes the node's current reward generation: every item of that
     generation still locked at that moment is wiped, in O(1).
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
    file_sha256: indexed(bytes32)
    pool: indexed(uint256)
    node: indexed(address)
    units: uint256
    reward: uint256

event WorkInvalidated:
    file_sha256: indexed(bytes32)
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
node_generation: public(HashMap[address, uint256])
generation_wiped_at: public(HashMap[address, HashMap[uint256, uint256]])
pool_work_units: public(HashMap[uint256, uint256])
total_claimed: public(uint256)
invalidation_window: public(uint256)
lock_period: public(uint256)
slash_penalty: public(uint256)


@deploy
def __init__(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
def submit_work(pool: uint256, node: address, file_sha256: bytes32, units: uint256):
    """
    @notice Record work done by one of the caller's nodes in an active pool.
    @param pool The pool the node works for.
    @param node The node that did the work.
    @param file_sha256 The sha256 of the rollout file; each file is submitted once.
    @param units The work units claimed.
    """
    assert nodes.node_info[node].provider == msg.sender, "work: not node provider"
    assert nodes.node_info[node].pool == pool, "work: node not in pool"
    assert pools.pool_info[pool].status == pools.ACTIVE, "work: pool not active"
    assert units > 0, "work: zero units"
    assert file_sha256 != empty(bytes32), "work: empty hash"
    assert self.work_info[file_sha256].status == 0, "work: duplicate file"
    reward: uint256 = units * pools.pool_info[pool].reward_rate
    self.work_info[file_sha256] = Work(
        pool=pool,
        node=node,
        provider=msg.sender,
        units=units,
        reward=reward,
        submitted_at=block.timestamp,
        unlock_at=block.timestamp + self.lock_period,
        generation=self.node_generation[node],
        status=SUBMITTED,
    )
    self.pool_work_units[pool] += units
    log WorkSubmitted(file_sha256=file_sha256, pool=pool, node=node, units=units, reward=reward)


@external
def hard_invalidate(file_sha256: bytes32) -> uint256:
    """
    @notice Void fraudulent work: wipe the node's locked rewards, eject the node from its
            pool and slash its provider by `slash_penalty`.
    @dev Validators only, within the invalidation window.
    @param file_sha256 The work to void.
    @return The amount slashed.
    """
    w: Work = self._check_invalidation(file_sha256)
    self.work_info[file_sha256].status = HARD_INVALIDATED
    self.pool_work_units[w.pool] -= w.units
    self.generation_wiped_at[w.node][self.node_generation[w.node]] = block.timestamp
    self.node_generation[w.node] += 1
    pool: uint256 = nodes.node_info[w.node].pool
    if pool != 0:
        pools._eject(pool, w.node)
    slashed: uint256 = stake._slash(w.provider, self.slash_penalty)
    log WorkInvalidated(file_sha256=file_sha256, node=w.node, hard=True, slashed=slashed, validator=msg.sender)
    return slashed


@external
def soft_invalidate(file_sha256: bytes32):
    """
    @notice Void work that is wrong but not fraudulent (e.g. stale); no slash.
    @dev Validators only, within the invalidation window.
    @param file_sha256 The work to void.
    """
    w: Work = self._check_invalidation(file_sha256)
    self.work_info[file_sha256].status = SOFT_INVALIDATED
    self.pool_work_units[w.pool] -= w.units
    log WorkInvalidated(file_sha256=file_sha256, node=w.node, hard=False, slashed=0, validator=msg.sender)


@external
@nonreentrant
def claim(files: DynArray[bytes32, MAX_CLAIM]) -> uint256:
    """
    @notice Claim the rewards of the caller's unlocked, valid work items (minted to the caller).
    @param files The sha256 keys of the work items; each can be claimed once.
    @return The amount minted.
    """
    total: uint256 = 0
    for f: bytes32 in files:
        w: Work = self.work_info[f]
        assert w.provider == msg.sender, "work: not your work"
        assert w.status != CLAIMED, "work: already claimed"
        assert w.status == SUBMITTED, "work: invalidated"
        assert block.timestamp >= w.unlock_at, "work: locked"
        assert not self._wiped(w), "work: rewards wiped"
        self.work_info[f].status = CLAIMED
        total += w.reward
    self.total_claimed += total
    log RewardsClaimed(provider=msg.sender, amount=total, count=len(files))
    if total > 0:
        extcall Mintable(stake.token.address).mint(msg.sender, total)
    return total


@external
def set_work_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    """
    @notice Set the invalidation window, reward lock period and hard-invalidation penalty.
    @dev Federator only. The lock may not be shorter than the window.
    @param invalidation_window Seconds after submission during which validators may invalidate.
    @param lock_period Seconds after submission before a reward is claimable.
    @param slash_penalty Stake slashed on a hard invalidation.
    """
    roles._check_federator()
    self._set_params(invalidation_window, lock_period, slash_penalty)


@external
@view
def claimable(file_sha256: bytes32) -> bool:
    """
    @notice Whether the work item can be claimed now by its provider.
    @param file_sha256 The work item.
    @return True when valid, unclaimed, unlocked and not wiped.
    """
    w: Work = self.work_info[file_sha256]
    return w.status == SUBMITTED and block.timestamp >= w.unlock_at and not self._wiped(w)


@internal
@view
def _wiped(w: Work) -> bool:
    if w.generation >= self.node_generation[w.node]:
        return False
    return w.unlock_at > self.generation_wiped_at[w.node][w.generation]


@internal
@view
def _check_invalidation(file_sha256: bytes32) -> Work:
    roles._check_validator()
    w: Work = self.work_info[file_sha256]
    assert w.status != 0, "work: unknown work"
    assert w.status == SUBMITTED, "work: not pending"
    assert block.timestamp < w.submitted_at + self.invalidation_window, "work: invalidation window closed"
    return w


@internal
def _set_params(invalidation_window: uint256, lock_period: uint256, slash_penalty: uint256):
    assert lock_period >= invalidation_window, "work: lock shorter than window"
    self.invalidation_window = invalidation_window
    self.lock_period = lock_period
    self.slash_penalty = slash_penalty
    log WorkParamsSet(invalidation_window=invalidation_window, lock_period=lock_period, slash_penalty=slash_penalty)
