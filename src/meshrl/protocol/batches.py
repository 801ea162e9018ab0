"""Batches of work (issue 46): the leaf encoding, the Merkle tree over a batch's leaves, and
its proofs, exactly as `contracts/batches.vy` checks them (docs/protocol.md, "Batches").

- A leaf is keccak256(0x00 ‖ abi_encode(address node, bytes32 file_sha256, uint256 units,
  uint256 step, uint256 counter)); an inner node is keccak256(0x01 ‖ left ‖ right): the tag
  byte keeps a leaf from ever being taken for an inner node (or the reverse).
- A batch of `count` leaves (1..2**16) is a complete binary tree of depth d = bit length of
  count - 1 (1 leaf: the root is the leaf; 5 leaves: depth 3), leaves in order at the bottom,
  the positions past `count` filled with 32 zero bytes.
- A proof is index-based: the d siblings from the leaf up; bit k of the leaf's index (lowest
  first) says whether the running hash is the right (1) or the left (0) child at level k. Its
  length must be exactly d, and the index below `count`.
- The batch id is keccak256(abi_encode(node, root)) (a file's work id with the root in place
  of its sha256); a leaf keeps its file's work id keccak256(abi_encode(node, file_sha256)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_abi import encode
from eth_utils import keccak, to_checksum_address

from meshrl.protocol.signing import work_id

__all__ = [
    "LEAF_TAG",
    "MAX_BATCH",
    "NODE_TAG",
    "Batch",
    "Leaf",
    "batch_id",
    "depth",
    "merkle_proof",
    "merkle_root",
    "verify_proof",
]

LEAF_TAG = b"\x00"
NODE_TAG = b"\x01"
MAX_BATCH = 2**16  # batches.vy's 2**PROOF_DEPTH
ZERO = bytes(32)
_U256 = 2**256


@dataclass(frozen=True)
class Leaf:
    """One file of a batch: its node, sha256, work units, step and file counter. The step slot
    holds the file's policy version (a file's step is its version: issue #44)."""

    node: str
    file_sha256: bytes
    units: int
    step: int = 0  # the file's policy version
    counter: int = 0

    def __post_init__(self) -> None:
        if len(self.file_sha256) != 32:
            raise ValueError("file_sha256 must be 32 bytes")
        for name in ("units", "step", "counter"):
            if not 0 <= getattr(self, name) < _U256:
                raise ValueError(f"{name} must be a uint256")

    def hash(self) -> bytes:
        enc = encode(["address", "bytes32", "uint256", "uint256", "uint256"],
                     [to_checksum_address(self.node), self.file_sha256, self.units, self.step,
                      self.counter])
        return keccak(LEAF_TAG + enc)

    @property
    def work_id(self) -> bytes:
        return work_id(self.node, self.file_sha256)


def depth(count: int) -> int:
    """The tree's depth for `count` leaves: the bit length of count - 1."""
    if not 1 <= count <= MAX_BATCH:
        raise ValueError(f"a batch has 1..{MAX_BATCH} leaves, not {count}")
    return (count - 1).bit_length()


def _node(left: bytes, right: bytes) -> bytes:
    return keccak(NODE_TAG + left + right)


def _levels(hashes: Sequence[bytes]) -> list[list[bytes]]:
    level = list(hashes) + [ZERO] * ((1 << depth(len(hashes))) - len(hashes))
    levels = [level]
    while len(level) > 1:
        level = [_node(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        levels.append(level)
    return levels


def merkle_root(hashes: Sequence[bytes]) -> bytes:
    """The root over leaf hashes (`Leaf.hash`), in order."""
    return _levels(hashes)[-1][0]


def merkle_proof(hashes: Sequence[bytes], index: int) -> list[bytes]:
    """The siblings of leaf `index`, from the leaf up."""
    if not 0 <= index < len(hashes):
        raise IndexError(index)
    return [level[(index >> k) ^ 1] for k, level in enumerate(_levels(hashes)[:-1])]


def verify_proof(leaf_hash: bytes, index: int, count: int, proof: Sequence[bytes],
                 root: bytes) -> bool:
    """What the contract checks of a leaf's proof."""
    if not 0 <= index < count or len(proof) != depth(count):
        return False
    h = leaf_hash
    for k, sib in enumerate(proof):
        h = _node(sib, h) if (index >> k) & 1 else _node(h, sib)
    return h == root


def batch_id(node: str, root: bytes) -> bytes:
    """The batch's work-item key: keccak256(abi_encode(node, root))."""
    return work_id(node, root)


@dataclass(frozen=True)
class Batch:
    """A node's files committed in one submission: the leaves (in order), their root, count,
    total units, and each leaf's proof (`proof(i)`)."""

    leaves: tuple[Leaf, ...]
    root: bytes
    hashes: tuple[bytes, ...]

    @classmethod
    def of(cls, leaves: Sequence[Leaf]) -> Batch:
        """The batch of `leaves`: all of one node, each file once."""
        if not leaves:
            raise ValueError("a batch has at least one leaf")
        node = to_checksum_address(leaves[0].node)
        if any(to_checksum_address(x.node) != node for x in leaves):
            raise ValueError("a batch holds the files of one node")
        if len({x.file_sha256 for x in leaves}) != len(leaves):
            raise ValueError("a file is in a batch once")
        hashes = tuple(x.hash() for x in leaves)
        return cls(tuple(leaves), merkle_root(hashes), hashes)

    @property
    def node(self) -> str:
        return to_checksum_address(self.leaves[0].node)

    @property
    def count(self) -> int:
        return len(self.leaves)

    @property
    def units(self) -> int:
        return sum(x.units for x in self.leaves)

    @property
    def id(self) -> bytes:
        return batch_id(self.node, self.root)

    def proof(self, index: int) -> list[bytes]:
        return merkle_proof(self.hashes, index)

    def index_of(self, file_sha256: bytes) -> int:
        for i, x in enumerate(self.leaves):
            if x.file_sha256 == file_sha256:
                return i
        raise KeyError(file_sha256.hex())
