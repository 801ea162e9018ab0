"""EIP-191 request signatures: what a sender signs and how a receiver recovers the signer.

The signed message is the seven lines (joined by \\n, no trailing newline)

    meshrl-request-v2, {audience}, {METHOD}, {path with query}, {sha256(body) hex}, {nonce},
    {timestamp}

where the audience names the one service the request is for (`meshrl/{chain id}/orchestrator/
{pool id}`, `meshrl/{chain id}/discovery/{name}`): a request signed for one pool's orchestrator
is refused by every other service, so a service that receives it cannot replay it elsewhere.

prefixed as `personal_sign` does (`"\\x19Ethereum Signed Message:\\n" + len + text`) and hashed
with keccak256, so any Ethereum wallet can sign it. Signatures are 65 bytes `r || s || v` with
v in {27, 28}, sent as 0x-hex. secp256k1 runs in C (coincurve): recovery costs ~50 us, about half
of what eth-account's generic path costs, which matters at thousands of requests per second.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import time
from dataclasses import dataclass

import coincurve
from eth_utils import keccak, to_checksum_address

__all__ = [
    "AUDIENCE_RE",
    "HEADER_ADDRESS",
    "HEADER_AUDIENCE",
    "HEADER_BODY_SHA256",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "UNBOUND_AUDIENCE",
    "SignedHeaders",
    "address_of",
    "discovery_audience",
    "orchestrator_audience",
    "recover_signer",
    "request_message",
    "sign_request",
]

HEADER_ADDRESS = "x-address"
HEADER_SIGNATURE = "x-signature"
HEADER_NONCE = "x-nonce"
HEADER_TIMESTAMP = "x-timestamp"
HEADER_BODY_SHA256 = "x-content-sha256"
HEADER_AUDIENCE = "x-audience"

PREFIX = "meshrl-request-v2"
NONCE_RE = re.compile(r"^[0-9A-Za-z_-]{8,64}\Z", re.ASCII)
AUDIENCE_RE = re.compile(r"^[0-9A-Za-z._:/-]{1,128}\Z", re.ASCII)
# a service built without an identity (and `sign_request` without one) uses this: such services
# are not told apart, so every real service passes its own (`orchestrator_audience`, ...)
UNBOUND_AUDIENCE = "meshrl/unbound"


def orchestrator_audience(chain_id: int, pool_id: int) -> str:
    """The audience of the orchestrator of pool `pool_id` on chain `chain_id`."""
    return f"meshrl/{int(chain_id)}/orchestrator/{int(pool_id)}"


def discovery_audience(chain_id: int, name: str) -> str:
    """The audience of the discovery service called `name` on chain `chain_id`."""
    audience = f"meshrl/{int(chain_id)}/discovery/{name}"
    if not AUDIENCE_RE.match(audience):
        raise ValueError(f"not a valid service name: {name!r}")
    return audience
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def request_message(
    method: str, path: str, body_sha256: str, nonce: str, timestamp: int,
    audience: str = UNBOUND_AUDIENCE,
) -> bytes:
    """The text a request's signature covers (method upper-cased, sha256 as lower hex)."""
    parts = (PREFIX, audience, method.upper(), path, body_sha256.lower(), nonce, str(timestamp))
    return "\n".join(parts).encode()


def _eip191_hash(message: bytes) -> bytes:
    return keccak(b"\x19Ethereum Signed Message:\n" + str(len(message)).encode() + message)


def _key_bytes(private_key: bytes | str) -> bytes:
    if isinstance(private_key, str):
        private_key = bytes.fromhex(private_key.removeprefix("0x"))
    if len(private_key) != 32:
        raise ValueError("a private key is 32 bytes")
    return private_key


def address_of(private_key: bytes | str) -> str:
    """The checksummed Ethereum address of a private key."""
    pub = coincurve.PrivateKey(_key_bytes(private_key)).public_key.format(compressed=False)
    return to_checksum_address(keccak(pub[1:])[-20:])


@dataclass(frozen=True)
class SignedHeaders:
    """The six headers of a signed request."""

    address: str
    signature: str
    nonce: str
    timestamp: int
    body_sha256: str
    audience: str = UNBOUND_AUDIENCE

    def as_dict(self) -> dict[str, str]:
        return {
            HEADER_ADDRESS: self.address,
            HEADER_SIGNATURE: self.signature,
            HEADER_NONCE: self.nonce,
            HEADER_TIMESTAMP: str(self.timestamp),
            HEADER_BODY_SHA256: self.body_sha256,
            HEADER_AUDIENCE: self.audience,
        }


def sign_request(
    private_key: bytes | str,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    body_sha256: str | None = None,
    nonce: str | None = None,
    timestamp: int | None = None,
    address: str | None = None,
    audience: str = UNBOUND_AUDIENCE,
) -> SignedHeaders:
    """Sign one request for the service `audience`. Pass `body_sha256` instead of `body` when
    streaming a large body."""
    if not AUDIENCE_RE.match(audience):
        raise ValueError(f"not a valid audience: {audience!r}")
    key = _key_bytes(private_key)
    digest = body_sha256 if body_sha256 is not None else hashlib.sha256(body).hexdigest()
    nonce = nonce if nonce is not None else secrets.token_hex(16)
    ts = int(time.time()) if timestamp is None else timestamp
    h = _eip191_hash(request_message(method, path, digest, nonce, ts, audience))
    raw = coincurve.PrivateKey(key).sign_recoverable(h, hasher=None)  # r || s || recid, low s
    sig = raw[:64] + bytes([raw[64] + 27])
    return SignedHeaders(address or address_of(key), "0x" + sig.hex(), nonce, ts, digest.lower(),
                         audience)


def recover_signer(message: bytes, signature: bytes) -> str:
    """The checksummed address whose key signed `message` (EIP-191); ValueError if malformed."""
    if len(signature) != 65:
        raise ValueError("signature must be 65 bytes")
    v = signature[64]
    if v not in (27, 28):
        raise ValueError("signature v must be 27 or 28")
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    if not (0 < r < _SECP256K1_N and 0 < s <= _SECP256K1_N // 2):
        raise ValueError("signature r/s out of range (or high s)")
    try:
        pub = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + bytes([v - 27]), _eip191_hash(message), hasher=None
        )
    except Exception as e:  # coincurve raises plain Exception on unrecoverable input
        raise ValueError(f"unrecoverable signature: {e}") from None
    return _checksum(keccak(pub.format(compressed=False)[1:])[-20:])


@functools.lru_cache(maxsize=1 << 16)
def _checksum(raw: bytes) -> str:
    """EIP-55 spelling, cached: a server sees the same few thousand senders over and over."""
    return to_checksum_address(raw)
