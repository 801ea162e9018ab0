"""Off-chain halves of the contracts' signature checks (EIP-191 `personal_sign` over 32 bytes)
and of the work id.

The digests mirror `nodes.ownership_digest`, `pools.invite_digest` and `work.work_id` exactly
(abi-encoded, domain-separated by contract address and chain id); tests compare both sides.
Ownership proofs and invites name the node's generation (`Protocol.node_generation`): a move
to another provider or an ejection starts a new one and voids what was signed before.
"""

from __future__ import annotations

from eth_abi import encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import keccak, to_checksum_address

__all__ = [
    "invite_digest",
    "ownership_digest",
    "recover_digest",
    "sign_digest",
    "sign_invite",
    "sign_ownership",
    "work_id",
]


def ownership_digest(
    protocol: str, chain_id: int, node: str, provider: str, generation: int
) -> bytes:
    """What a node key signs so that `provider` may add it while it is in `generation`."""
    types = ["address", "uint256", "address", "address", "uint256"]
    return keccak(encode(types, [protocol, chain_id, node, provider, generation]))


def invite_digest(
    protocol: str,
    chain_id: int,
    domain: int,
    pool: int,
    node: str,
    generation: int,
    nonce: int,
    expiry: int,
) -> bytes:
    """What a pool manager signs to invite `node` (in `generation`) into `pool`, once."""
    types = ["address", "uint256", "uint256", "uint256", "address", "uint256", "uint256", "uint256"]
    values = [protocol, chain_id, domain, pool, node, generation, nonce, expiry]
    return keccak(encode(types, values))


def work_id(node: str, file_sha256: bytes) -> bytes:
    """The key of the work item `node` submits for a rollout file: keccak256(node, sha256)."""
    if len(file_sha256) != 32:
        raise ValueError("file_sha256 must be 32 bytes")
    return keccak(encode(["address", "bytes32"], [to_checksum_address(node), file_sha256]))


def sign_digest(private_key: bytes | str, digest: bytes) -> bytes:
    """A 65-byte EIP-191 signature (r ++ s ++ v, v in {27, 28}, low s) over a 32-byte digest."""
    if len(digest) != 32:
        raise ValueError("digest must be 32 bytes")
    return bytes(Account.sign_message(encode_defunct(primitive=digest), private_key).signature)


def recover_digest(digest: bytes, signature: bytes) -> str:
    """The address whose key made `signature` (`sign_digest`) over `digest`; raises
    ValueError on a malformed signature."""
    if len(digest) != 32 or len(signature) != 65:
        raise ValueError("a digest is 32 bytes and a signature 65")
    try:
        return str(Account.recover_message(encode_defunct(primitive=digest),
                                           signature=signature))
    except Exception as e:  # eth_keys' own error types: malformed r, s or v
        raise ValueError(f"malformed signature: {e}") from None


def sign_ownership(
    node_key: bytes | str, protocol: str, chain_id: int, provider: str, generation: int
) -> bytes:
    """The node key's proof that `provider` controls it, valid in `generation` only."""
    node = Account.from_key(node_key).address
    digest = ownership_digest(protocol, chain_id, node, to_checksum_address(provider), generation)
    return sign_digest(node_key, digest)


def sign_invite(
    manager_key: bytes | str,
    protocol: str,
    chain_id: int,
    domain: int,
    pool: int,
    node: str,
    generation: int,
    nonce: int,
    expiry: int,
) -> bytes:
    """The pool manager's invite for `node` in its current `generation`; `expiry` must be at
    most a day (`MAX_INVITE_LIFETIME`) after the join."""
    digest = invite_digest(
        protocol, chain_id, domain, pool, to_checksum_address(node), generation, nonce, expiry
    )
    return sign_digest(manager_key, digest)
