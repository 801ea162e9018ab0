"""Off-chain halves of the contracts' signature checks (EIP-191 `personal_sign` over 32 bytes).

The digests mirror `nodes.ownership_digest` and `pools.invite_digest` exactly (abi-encoded,
domain-separated by contract address and chain id); tests compare both sides.
"""

from __future__ import annotations

from eth_abi import encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import keccak, to_checksum_address

__all__ = ["invite_digest", "ownership_digest", "sign_digest", "sign_invite", "sign_ownership"]


def ownership_digest(protocol: str, chain_id: int, provider: str) -> bytes:
    """What a node key signs so that `provider` may add it."""
    return keccak(encode(["address", "uint256", "address"], [protocol, chain_id, provider]))


def invite_digest(
    protocol: str, chain_id: int, domain: int, pool: int, node: str, nonce: int, expiry: int
) -> bytes:
    """What a pool manager signs to invite `node` into `pool` (usable once, until `expiry`)."""
    types = ["address", "uint256", "uint256", "uint256", "address", "uint256", "uint256"]
    return keccak(encode(types, [protocol, chain_id, domain, pool, node, nonce, expiry]))


def sign_digest(private_key: bytes | str, digest: bytes) -> bytes:
    """A 65-byte EIP-191 signature (r ++ s ++ v, v in {27, 28}, low s) over a 32-byte digest."""
    if len(digest) != 32:
        raise ValueError("digest must be 32 bytes")
    return bytes(Account.sign_message(encode_defunct(primitive=digest), private_key).signature)


def sign_ownership(node_key: bytes | str, protocol: str, chain_id: int, provider: str) -> bytes:
    """The node key's proof that `provider` controls it."""
    return sign_digest(
        node_key, ownership_digest(protocol, chain_id, to_checksum_address(provider))
    )


def sign_invite(
    manager_key: bytes | str,
    protocol: str,
    chain_id: int,
    domain: int,
    pool: int,
    node: str,
    nonce: int,
    expiry: int,
) -> bytes:
    """The pool manager's invite for `node`."""
    return sign_digest(
        manager_key, invite_digest(protocol, chain_id, domain, pool, node, nonce, expiry)
    )
