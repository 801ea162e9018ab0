# pragma version ~=0.4.3
"""
@title Nodes
@notice A provider adds a node with the node key's EIP-191 signature over
        keccak256(abi_encode(protocol address, chain id, node, provider, generation)), proving
        it controls the node key; the node's compute units raise the provider's minimum stake.
@dev A node's generation counts the events that close a chapter of its history: its removal
     from a provider, an ejection from a pool, a hard invalidation. Ownership proofs and pool
     invites name the generation, so a move or an ejection voids every proof and invite
     signed before it; work items name it too, so a hard invalidation wipes the rewards of the
     chapter the work was done in and never those of a later holder.
"""

from . import sig
from . import stake

uses: stake

MAX_COMPUTE_UNITS: constant(uint256) = 2**64

struct Node:
    provider: address
    compute_units: uint256
    pool: uint256

event NodeAdded:
    provider: indexed(address)
    node: indexed(address)
    compute_units: uint256

event NodeRemoved:
    provider: indexed(address)
    node: indexed(address)


node_info: public(HashMap[address, Node])
node_generation: public(HashMap[address, uint256])


@external
def add_node(node: address, compute_units: uint256, signature: Bytes[65]):
    """
    @notice Add `node` to the caller's nodes.
    @param node The node's address (its key signs the ownership proof).
    @param compute_units The node's compute units (positive); they raise the minimum stake.
    @param signature The node key's EIP-191 signature over `ownership_digest(node, caller)`.
    """
    assert stake.providers[msg.sender].registered, "nodes: not a provider"
    assert node != empty(address), "nodes: zero address"
    assert self.node_info[node].provider == empty(address), "nodes: already added"
    assert compute_units > 0, "nodes: zero compute units"
    assert compute_units <= MAX_COMPUTE_UNITS, "nodes: too many compute units"
    assert sig._recover(self._ownership_digest(node, msg.sender), signature) == node, "nodes: bad node signature"
    stake._add_units(msg.sender, compute_units)
    self.node_info[node] = Node(provider=msg.sender, compute_units=compute_units, pool=0)
    log NodeAdded(provider=msg.sender, node=node, compute_units=compute_units)


@external
def remove_node(node: address):
    """
    @notice Remove one of the caller's nodes; it must not be in a pool.
    @dev Opens a new generation: proofs signed for any provider before now are void.
    @param node The node to remove.
    """
    n: Node = self.node_info[node]
    assert n.provider == msg.sender, "nodes: not node provider"
    assert n.pool == 0, "nodes: node in a pool"
    stake._remove_units(msg.sender, n.compute_units)
    self.node_info[node] = empty(Node)
    self.node_generation[node] += 1
    log NodeRemoved(provider=msg.sender, node=node)


@external
@view
def ownership_digest(node: address, provider: address) -> bytes32:
    """
    @notice The digest the key of `node` signs (EIP-191) to be added by `provider` now.
    @param node The node being added.
    @param provider The provider adding it.
    @return keccak256(abi_encode(this contract, chain id, node, provider, node generation)).
    """
    return self._ownership_digest(node, provider)


@internal
@view
def _ownership_digest(node: address, provider: address) -> bytes32:
    return keccak256(abi_encode(self, chain.id, node, provider, self.node_generation[node]))


@internal
@view
def _check_controller(node: address):
    # The node key itself or the provider that owns it may act for the node.
    assert node == msg.sender or self.node_info[node].provider == msg.sender, "nodes: not node or provider"


@internal
def _set_pool(node: address, pool: uint256):
    self.node_info[node].pool = pool


@internal
def _next_generation(node: address):
    self.node_generation[node] += 1
