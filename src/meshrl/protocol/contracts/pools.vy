# pragma version ~=0.4.3
"""
@title Compute pools
@notice The federator creates domains and pools (each with a manager key, a reward rate
        per work unit and a maximum of work units per file). A pool goes pending -> active ->
        completed. A node joins an active pool only with a one-time invite the manager signed
        (EIP-191) over keccak256(abi_encode(protocol, chain id, domain, pool, node, node
        generation, nonce, expiry)), at most MAX_INVITE_LIFETIME before its expiry, while its
        provider's stake covers its nodes. An ejection opens a new node generation, which
        voids every invite the node still holds.
"""

from . import roles
from . import sig
from . import nodes
from . import stake

uses: roles
uses: nodes
uses: stake

PENDING: constant(uint8) = 1
ACTIVE: constant(uint8) = 2
COMPLETED: constant(uint8) = 3
# Bounds that keep every sum a user can grow (units, rewards, supply) far from overflow:
# 2**64 units * 2**128 per unit fits a reward in 2**192.
MAX_UNITS: constant(uint256) = 2**64
MAX_REWARD_RATE: constant(uint256) = 2**128
MAX_INVITE_LIFETIME: constant(uint256) = 86400

struct Pool:
    domain: uint256
    manager: address
    status: uint8
    reward_rate: uint256
    node_count: uint256
    max_units: uint256
    min_interval: uint256

event DomainCreated:
    domain: indexed(uint256)
    name: String[64]

event PoolCreated:
    pool: indexed(uint256)
    domain: indexed(uint256)
    manager: address
    reward_rate: uint256

event PoolStatusChanged:
    pool: indexed(uint256)
    status: uint8

event RewardRateSet:
    pool: indexed(uint256)
    reward_rate: uint256

event PoolManagerSet:
    pool: indexed(uint256)
    manager: indexed(address)

event PoolLimitsSet:
    pool: indexed(uint256)
    max_units: uint256
    min_interval: uint256

event NodeJoined:
    pool: indexed(uint256)
    node: indexed(address)
    nonce: uint256

event NodeLeft:
    pool: indexed(uint256)
    node: indexed(address)

event NodeEjected:
    pool: indexed(uint256)
    node: indexed(address)
    by: address

event NodeBlacklisted:
    pool: indexed(uint256)
    node: indexed(address)


domain_names: public(HashMap[uint256, String[64]])
domain_count: public(uint256)
pool_info: public(HashMap[uint256, Pool])
pool_count: public(uint256)
invite_used: public(HashMap[bytes32, bool])
blacklisted: public(HashMap[uint256, HashMap[address, bool]])
# The federator tenure that appointed each pool's manager (a hand-over voids older ones).
manager_epoch: public(HashMap[uint256, uint256])
# The hand-over count at each pool's manager appointment (a later hand-over that strips the
# manager's key, keeping the other grants, voids it).
manager_handover: public(HashMap[uint256, uint256])


@external
def create_domain(name: String[64]) -> uint256:
    """
    @notice Create a domain (a family of tasks); ids start at 1.
    @dev Federator only.
    @param name A human-readable name.
    @return The new domain id.
    """
    roles._check_federator()
    assert len(name) > 0, "pools: empty name"
    self.domain_count += 1
    self.domain_names[self.domain_count] = name
    log DomainCreated(domain=self.domain_count, name=name)
    return self.domain_count


@external
def create_pool(domain: uint256, manager: address, reward_rate: uint256, max_units: uint256) -> uint256:
    """
    @notice Create a pending pool in `domain`; ids start at 1.
    @dev Federator only. No submission interval (see `set_pool_limits`).
    @param domain An existing domain id.
    @param manager The key that signs invites and may eject nodes.
    @param reward_rate Reward (token base units) per work unit, at most MAX_REWARD_RATE.
    @param max_units The most work units one file may claim (1..MAX_UNITS).
    @return The new pool id.
    """
    roles._check_federator()
    assert domain != 0 and domain <= self.domain_count, "pools: unknown domain"
    assert manager != empty(address), "pools: zero address"
    assert reward_rate <= MAX_REWARD_RATE, "pools: reward rate too high"
    self._check_max_units(max_units)
    self.pool_count += 1
    pid: uint256 = self.pool_count
    self.pool_info[pid] = Pool(
        domain=domain,
        manager=manager,
        status=PENDING,
        reward_rate=reward_rate,
        node_count=0,
        max_units=max_units,
        min_interval=0,
    )
    self.manager_epoch[pid] = roles.federator_epoch
    self.manager_handover[pid] = roles.handovers
    log PoolCreated(pool=pid, domain=domain, manager=manager, reward_rate=reward_rate)
    log PoolLimitsSet(pool=pid, max_units=max_units, min_interval=0)
    return pid


@external
def start_pool(pool: uint256):
    """
    @notice Move a pool from pending to active.
    @dev Federator or the pool's manager.
    @param pool The pool id.
    """
    self._check_admin(pool)
    assert self.pool_info[pool].status == PENDING, "pools: not pending"
    self.pool_info[pool].status = ACTIVE
    log PoolStatusChanged(pool=pool, status=ACTIVE)


@external
def complete_pool(pool: uint256):
    """
    @notice Move a pool from active to completed; no more joins or work.
    @dev Federator or the pool's manager.
    @param pool The pool id.
    """
    self._check_admin(pool)
    assert self.pool_info[pool].status == ACTIVE, "pools: not active"
    self.pool_info[pool].status = COMPLETED
    log PoolStatusChanged(pool=pool, status=COMPLETED)


@external
def set_reward_rate(pool: uint256, reward_rate: uint256):
    """
    @notice Set the reward per work unit for work submitted from now on.
    @dev Federator only.
    @param pool The pool id.
    @param reward_rate Token base units per work unit.
    """
    roles._check_federator()
    self._check_pool(pool)
    assert reward_rate <= MAX_REWARD_RATE, "pools: reward rate too high"
    self.pool_info[pool].reward_rate = reward_rate
    log RewardRateSet(pool=pool, reward_rate=reward_rate)


@external
def set_pool_manager(pool: uint256, manager: address):
    """
    @notice Replace a pool's manager key (e.g. after a federator hand-over, or a leaked key).
    @dev Federator only. Invites the old key signed stop working at once. The appointment
         belongs to the current federator tenure (a hand-over revokes it by default).
    @param pool The pool id.
    @param manager The new manager.
    """
    roles._check_federator()
    self._check_pool(pool)
    assert manager != empty(address), "pools: zero address"
    self.pool_info[pool].manager = manager
    self.manager_epoch[pool] = roles.federator_epoch
    self.manager_handover[pool] = roles.handovers
    log PoolManagerSet(pool=pool, manager=manager)


@external
def set_pool_limits(pool: uint256, max_units: uint256, min_interval: uint256):
    """
    @notice Bound the work a pool accepts: units per file, and seconds between two
            submissions of one node (0: no interval).
    @dev Federator or the pool's manager. Applies to submissions from now on.
    @param pool The pool id.
    @param max_units The most work units one file may claim (1..MAX_UNITS).
    @param min_interval Seconds a node waits between submissions (at most a day).
    """
    self._check_admin(pool)
    self._check_max_units(max_units)
    assert min_interval <= 86400, "pools: interval too long"
    self.pool_info[pool].max_units = max_units
    self.pool_info[pool].min_interval = min_interval
    log PoolLimitsSet(pool=pool, max_units=max_units, min_interval=min_interval)


@external
def join_pool(pool: uint256, node: address, nonce: uint256, expiry: uint256, signature: Bytes[65]):
    """
    @notice Join `node` to an active pool with the manager's invite.
    @dev Called by the node key or its provider, whose stake must cover its nodes. Each
         invite works once, only for the node generation it names, and only within
         MAX_INVITE_LIFETIME of its expiry.
    @param pool The pool id.
    @param node The node joining.
    @param nonce The invite's nonce.
    @param expiry Unix time after which the invite is refused.
    @param signature The manager's EIP-191 signature over `invite_digest(...)`.
    """
    p: Pool = self.pool_info[pool]
    assert p.status == ACTIVE, "pools: not active"
    assert nodes.node_info[node].provider != empty(address), "pools: unknown node"
    nodes._check_controller(node)
    assert nodes.node_info[node].pool == 0, "pools: node already in a pool"
    assert not self.blacklisted[pool][node], "pools: node blacklisted"
    assert block.timestamp <= expiry, "pools: invite expired"
    assert expiry <= block.timestamp + MAX_INVITE_LIFETIME, "pools: invite lifetime too long"
    stake._check_covered(nodes.node_info[node].provider)
    digest: bytes32 = self._invite_digest(p.domain, pool, node, nonce, expiry)
    assert not self.invite_used[digest], "pools: invite used"
    assert sig._recover(digest, signature) == self._manager(pool), "pools: bad invite signature"
    self.invite_used[digest] = True
    nodes._set_pool(node, pool)
    self.pool_info[pool].node_count += 1
    log NodeJoined(pool=pool, node=node, nonce=nonce)


@external
def leave_pool(node: address):
    """
    @notice Take `node` out of its pool.
    @dev Called by the node key or its provider.
    @param node The node leaving.
    """
    nodes._check_controller(node)
    pool: uint256 = nodes.node_info[node].pool
    assert pool != 0, "pools: node not in a pool"
    self._remove(pool, node)
    log NodeLeft(pool=pool, node=node)


@external
def eject_node(pool: uint256, node: address):
    """
    @notice Remove `node` from `pool`; the invites it still holds become void.
    @dev Federator or the pool's manager.
    @param pool The pool id.
    @param node The node to eject.
    """
    self._check_admin(pool)
    assert nodes.node_info[node].pool == pool, "pools: node not in pool"
    self._eject(pool, node)


@external
def blacklist_node(pool: uint256, node: address):
    """
    @notice Eject `node` from `pool` (if in it) and refuse its future joins there.
    @dev Federator or the pool's manager.
    @param pool The pool id.
    @param node The node to blacklist.
    """
    self._check_admin(pool)
    self.blacklisted[pool][node] = True
    if nodes.node_info[node].pool == pool:
        self._eject(pool, node)
    log NodeBlacklisted(pool=pool, node=node)


@external
@view
def invite_digest(domain: uint256, pool: uint256, node: address, nonce: uint256, expiry: uint256) -> bytes32:
    """
    @notice The digest a pool manager signs (EIP-191) to invite `node` in its current generation.
    @return keccak256(abi_encode(this contract, chain id, domain, pool, node, node generation,
            nonce, expiry)).
    """
    return self._invite_digest(domain, pool, node, nonce, expiry)


@internal
@view
def _invite_digest(domain: uint256, pool: uint256, node: address, nonce: uint256, expiry: uint256) -> bytes32:
    generation: uint256 = nodes.node_generation[node]
    return keccak256(abi_encode(self, chain.id, domain, pool, node, generation, nonce, expiry))


@external
@view
def pool_manager(pool: uint256) -> address:
    """
    @notice The key that manages `pool` now (empty when a hand-over revoked its appointment).
    @param pool The pool id.
    @return The manager, or the empty address.
    """
    return self._manager(pool)


@internal
@view
def _manager(pool: uint256) -> address:
    if self.manager_epoch[pool] != roles.federator_epoch:
        return empty(address)
    manager: address = self.pool_info[pool].manager
    if roles.stripped_at[manager] > self.manager_handover[pool]:
        return empty(address)  # an outgoing federator's own appointment, not kept
    return manager


@internal
@view
def _check_pool(pool: uint256):
    assert self.pool_info[pool].status != 0, "pools: unknown pool"


@internal
@pure
def _check_max_units(max_units: uint256):
    assert max_units > 0 and max_units <= MAX_UNITS, "pools: bad max units"


@internal
@view
def _check_admin(pool: uint256):
    self._check_pool(pool)
    assert msg.sender == roles.federator or msg.sender == self._manager(pool), "pools: not pool admin"


@internal
def _remove(pool: uint256, node: address):
    nodes._set_pool(node, 0)
    self.pool_info[pool].node_count -= 1


@internal
def _eject(pool: uint256, node: address):
    self._remove(pool, node)
    nodes._next_generation(node)
    log NodeEjected(pool=pool, node=node, by=msg.sender)
