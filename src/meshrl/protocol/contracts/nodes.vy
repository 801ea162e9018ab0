# pragma version ~=0.4.3
"""
@title Nodes
@notice A provider adds a node with the node key's EIP-191 signature over
        keccak256(abi_encode(protocol address, chain id, provider)), proving it controls the
        node key; the node's compute units raise the provider's minimum stake.
"""

from . import sig
from . import stake

uses: stake

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


@external
def add_node(node: address, compute_units: uint256, signature: Bytes[65]):
    """
    @notice Add `node` to the caller's nodes.
    @param node The node's address (its key signs the ownership proof).
    @param compute_units The node's compute units (positive); they raise the minimum stake.
    @param signature The node key's EIP-191 signature over `ownership_digest(caller)`.
    """
    assert stake.providers[msg.sender].registered, "nodes: not a provider"
    assert node != empty(address), "nodes: zero address"
    assert self.node_info[node].provider == empty(address), "nodes: already added"
    assert compute_units > 0, "nodes: zero compute units"
    assert sig._recover(self._ownership_digest(msg.sender), signature) == node, "nodes: bad node signature"
    stake._add_units(msg.sender, compute_units)
    self.node_info[node] = Node(provider=msg.sender, compute_units=compute_units, pool=0)
    log NodeAdded(provider=msg.sender, node=node, compute_units=compute_units)


@external
def remove_node(node: address):
    """
    @notice Remove one of the caller's nodes; it must not be in a pool.
    @param node The node to remove.
    """
    n: Node = self.node_info[node]
    assert n.provider == msg.sender, "nodes: not node provider"
    assert n.pool == 0, "nodes: node in a pool"
    stake._remove_units(msg.sender, n.compute_units)
    self.node_info[node] = empty(Node)
    log NodeRemoved(provider=msg.sender, node=node)


@external
@view
def ownership_digest(provider: address) -> bytes32:
    """
    @notice The digest a node key signs (EIP-191) to be added by `provider`.
    @param provider The provider adding the node.
    @return keccak256(abi_encode(this contract, chain id, provider)).
    """
    return self._ownership_digest(provider)


@internal
@view
def _ownership_digest(provider: address) -> bytes32:
    return keccak256(abi_encode(self, chain.id, provider))


@internal
@view
def _check_controller(node: address):
    # The node key itself or the provider that owns it may act for the node.
    assert node == msg.sender or self.node_info[node].provider == msg.sender, "nodes: not node or provider"


@internal
def _set_pool(node: address, pool: uint256):
    self.node_info[node].pool = pool
