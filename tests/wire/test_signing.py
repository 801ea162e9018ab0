"""Request signatures: round trip, personal_sign compatibility, malformed input."""

from __future__ import annotations

import hashlib

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.wire.signing import address_of, recover_signer, request_message, sign_request

KEY = "0x" + "11" * 32


def test_address_matches_eth_account() -> None:
    assert address_of(KEY) == Account.from_key(KEY).address


def test_signature_is_personal_sign_of_the_message() -> None:
    h = sign_request(KEY, "post", "/heartbeat?x=1", b'{"a":1}', nonce="abcdefgh", timestamp=1700)
    msg = request_message("POST", "/heartbeat?x=1", hashlib.sha256(b'{"a":1}').hexdigest(),
                          "abcdefgh", 1700)
    expected = Account.sign_message(encode_defunct(primitive=msg), KEY).signature
    assert h.signature == "0x" + bytes(expected).hex()
    assert h.body_sha256 == hashlib.sha256(b'{"a":1}').hexdigest()
    assert h.as_dict()["x-timestamp"] == "1700"


@settings(max_examples=30, deadline=None)
@given(body=st.binary(max_size=256), path=st.text(min_size=1, max_size=40),
       key=st.integers(1, 2**255))
def test_recover_round_trip(body: bytes, path: str, key: int) -> None:
    k = key.to_bytes(32, "big")
    h = sign_request(k, "PUT", path, body)
    msg = request_message("PUT", path, h.body_sha256, h.nonce, h.timestamp)
    assert recover_signer(msg, bytes.fromhex(h.signature[2:])) == address_of(k)
    # any change of what was signed recovers another address
    other = request_message("PUT", path + "x", h.body_sha256, h.nonce, h.timestamp)
    assert recover_signer(other, bytes.fromhex(h.signature[2:])) != address_of(k)


@pytest.mark.parametrize("sig, reason", [
    (b"\x01" * 64, "65 bytes"),
    (b"\x01" * 64 + b"\x05", "v must be"),
    (b"\x00" * 32 + b"\x01" * 32 + b"\x1b", "out of range"),
    (b"\x01" * 32 + b"\xff" * 32 + b"\x1b", "out of range"),
])
def test_malformed_signatures_are_value_errors(sig: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        recover_signer(b"m", sig)
