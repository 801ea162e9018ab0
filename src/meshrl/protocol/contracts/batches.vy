# pragma version ~=0.4.3
# pragma optimize codesize
# pragma experimental-codegen
"""
@title meshrl batches (the protocol's extension)
@notice Work submitted in batches: one transaction commits many files of one node as a
        Merkle root (docs/protocol.md, "Batches"). A batch is a work item like a file's,
        keyed by keccak256(abi_encode(node, root)): it is judged, disputed, wiped and
        claimed as one. A validator takes one file out of it with its proof (`open_leaf`):
        the file becomes a work item of its own, keyed by its work id as if submitted alone,
        with the batch's window, lock and standing, and every verdict rule applies to it.
@dev Runs only by DELEGATECALL from the protocol contract (its `__default__`), on the
     protocol's storage: it initializes the same modules in the same order, so their
     storage is laid out alike (tests/protocol/test_artifacts.py compares the layouts); its
     own variables come after them all. Called directly it sees empty state (no node, no
     validator) and every function reverts. It keeps the protocol under EIP-170's size limit.
"""

from ethereum.ercs import IERC20
from . import roles
from . import stake
from . import nodes
from . import pools
from . import work
from . import treasury

initializes: roles
initializes: stake[roles := roles]
initializes: nodes[stake := stake]
initializes: pools[roles := roles, nodes := nodes, stake := stake]
initializes: work[roles := roles, stake := stake, nodes := nodes, pools := pools]
initializes: treasury[roles := roles, stake := stake]

# A batch commits to at most 2**PROOF_DEPTH files; a leaf's proof has one hash per level.
PROOF_DEPTH: constant(uint256) = 16
# Domain separation of the tree: a leaf hash is never taken for an inner node.
LEAF_TAG: constant(bytes1) = 0x00
NODE_TAG: constant(bytes1) = 0x01

event BatchSubmitted:
    batch_id: indexed(bytes32)
    pool: indexed(uint256)
    node: indexed(address)
    root: bytes32
    count: uint256
    units: uint256
    reward: uint256

event LeafOpened:
    batch_id: indexed(bytes32)
    work_id: indexed(bytes32)
    node: indexed(address)
    index: uint256
    file_sha256: bytes32
    units: uint256
    reward: uint256
    copy: bool

# batch id -> leaf index -> opened (a leaf leaves its batch once)
opened: HashMap[bytes32, HashMap[uint256, bool]]


@deploy
def __init__():
    # the protocol's storage is what counts; this contract's own stays empty
    roles.__init__()
    stake.__init__(empty(IERC20), 0, 0, 0)
    work.__init__(0, 0, 0)


@external
def submit_batch(pool: uint256, node: address, root: bytes32, count: uint256, units: uint256) -> bytes32:
    """
    @notice Record `count` files of one of the caller's nodes as one work item: a Merkle root
            over their leaves. The batch is judged, disputed, wiped and claimed as one item
            (`claim` takes its id); a validator takes a leaf out of it with `open_leaf`.
    @dev As `submit_work`, with `units` bounded by `count` files of the pool's `max_units`;
         with a submission interval, the batch counts as `count` submissions.
    @param pool The pool the node works for.
    @param node The node whose files the leaves are.
    @param root The root of the batch's Merkle tree.
    @param count The leaves, 1..2**16.
    @param units The leaves' work units together.
    @return The batch id, keccak256(abi_encode(node, root)).
    """
    assert count > 0 and count <= 2**PROOF_DEPTH, "work: bad count"
    bid: bytes32 = work._submit(pool, node, root, units, count)
    log BatchSubmitted(batch_id=bid, pool=pool, node=node, root=root, count=count, units=units, reward=work.work_info[bid].reward)
    return bid


@external
@nonreentrant
def open_leaf(node: address, root: bytes32, index: uint256, file_sha256: bytes32, units: uint256,
              step: uint256, counter: uint256, proof: DynArray[bytes32, PROOF_DEPTH], verdict: uint8) -> bytes32:
    """
    @notice Take one file out of a pending batch, proven against its root: the file becomes a
            work item of its own (its work id as if submitted alone; the batch's pool,
            provider, window, lock and standing), its units and reward leave the batch, and
            `verdict` (2 soft, 3 hard; 0 none) accuses it at once. A file that already has a
            work item (submitted twice) is void instead: its units leave the batch, and the
            verdict accuses the batch that carries the copy.
    @dev Bonded validators only, within the batch's invalidation window (or its provider's
         review); each leaf once. The proof has one sibling per level of the tree, whose depth
         is the bit length of count - 1; the leaf index's bits, lowest first, say whether the
         running hash is the right (1) or the left (0) child.
    @param node The batch's node (the leaf's node).
    @param root The batch's root.
    @param index The leaf's position, 0..count - 1.
    @param file_sha256 The leaf's file.
    @param units The leaf's work units (at most what the batch has left).
    @param step The leaf's trainer step.
    @param counter The leaf's file counter.
    @param proof The sibling hashes from the leaf up.
    @param verdict 0, 2 (soft) or 3 (hard).
    @return The work id now open or accused: the file's, or the batch's for a copy.
    """
    roles._check_validator()
    bid: bytes32 = work._work_id(node, root)
    b: work.Work = work.work_info[bid]
    assert b.count > 0 and b.status == work.SUBMITTED, "work: not pending"
    assert block.timestamp < max(b.judge_until, work.review_until[b.provider]), "work: invalidation window closed"
    assert verdict == 0 or verdict == work.SOFT_INVALIDATED or verdict == work.HARD_INVALIDATED, "work: bad verdict"
    assert index < b.count and not self.opened[bid][index], "work: bad leaf"
    h: bytes32 = keccak256(concat(LEAF_TAG, abi_encode(node, file_sha256, units, step, counter)))
    i: uint256 = index
    n: uint256 = b.count - 1  # one level per bit of count - 1: the proof ends at the root
    for sib: bytes32 in proof:
        assert n > 0, "work: bad proof"
        if i & 1 == 1:
            h = keccak256(concat(NODE_TAG, sib, h))
        else:
            h = keccak256(concat(NODE_TAG, h, sib))
        i >>= 1
        n >>= 1
    assert n == 0 and h == root, "work: bad proof"
    self.opened[bid][index] = True
    # the leaf's units leave the batch (never more than it has left: a batch whose leaves
    # claim more than its total pays at most its total), at the batch's rate
    take: uint256 = min(units, b.units)
    reward: uint256 = 0
    if take > 0:
        reward = b.reward // b.units * take
    work.work_info[bid].units = b.units - take
    work.work_info[bid].reward = b.reward - reward
    wid: bytes32 = work._work_id(node, file_sha256)
    copy: bool = work.work_info[wid].status != 0
    accused: bytes32 = wid
    if copy:
        # the same file in another item (or twice in this batch): void here, paid at most once
        work.pool_work_units[b.pool] -= take
        accused = bid
    else:
        b.units = take
        b.reward = reward
        b.count = 0
        work.work_info[wid] = b
    log LeafOpened(batch_id=bid, work_id=wid, node=node, index=index, file_sha256=file_sha256, units=take, reward=reward, copy=copy)
    if verdict != 0:
        work._accuse(accused, verdict == work.HARD_INVALIDATED)
    return accused
