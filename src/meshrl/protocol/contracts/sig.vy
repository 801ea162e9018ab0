# pragma version ~=0.4.3
"""
@title EIP-191 signatures
@notice Recovers the signer of a `personal_sign` signature over a 32-byte digest,
        refusing malformed signatures, bad `v` values and malleable (high) `s` values.
"""

# secp256k1n / 2: a canonical signature has s <= this (EIP-2).
HALF_N: constant(uint256) = 57896044618658097711785492504343953926418782139537452191302581570759080747168


@internal
@pure
def _eth_signed_hash(digest: bytes32) -> bytes32:
    return keccak256(concat(b"\x19Ethereum Signed Message:\n32", digest))


@internal
@pure
def _recover(digest: bytes32, signature: Bytes[65]) -> address:
    assert len(signature) == 65, "sig: bad length"
    r: uint256 = convert(slice(signature, 0, 32), uint256)
    s: uint256 = convert(slice(signature, 32, 32), uint256)
    v: uint256 = convert(slice(signature, 64, 1), uint256)
    assert v == 27 or v == 28, "sig: bad v"
    assert s != 0 and s <= HALF_N, "sig: malleable s"
    assert r != 0, "sig: bad r"
    signer: address = ecrecover(self._eth_signed_hash(digest), v, r, s)
    assert signer != empty(address), "sig: invalid"
    return signer
