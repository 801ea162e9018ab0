"""RequestGuard: every refusal has its code (and the code's status), and a refused request
changes nothing."""

from __future__ import annotations

import json

import pytest

from meshrl.wire import ErrorCode, GuardConfig, RequestGuard, WireError, sign_request

KEY_A, KEY_B = "0x" + "aa" * 32, "0x" + "bb" * 32
NOW = 1_000_000


def guard(**kw: int) -> RequestGuard:
    return RequestGuard(GuardConfig(**kw), clock=lambda: NOW)


def signed(key: str = KEY_A, body: bytes = b"{}", path: str = "/x", **kw: object) -> dict:
    kw.setdefault("timestamp", NOW)
    return sign_request(key, "POST", path, body, **kw).as_dict()  # type: ignore[arg-type]


def refused(g: RequestGuard, headers: dict, body: bytes = b"{}", path: str = "/x") -> WireError:
    with pytest.raises(WireError) as e:
        g.check("POST", path, headers, body)
    return e.value


def test_valid_request_returns_the_signer() -> None:
    g = guard()
    v = g.check("POST", "/x", signed(), b"{}")
    assert v.address.lower() == sign_request(KEY_A, "GET", "/").address.lower()
    assert len(g.nonces) == 1


def test_replay_is_409_and_nonce_kept_until_window_closes() -> None:
    g, h = guard(), signed()
    g.check("POST", "/x", h, b"{}")
    e = refused(g, h)
    assert (e.status, e.code) == (409, ErrorCode.REPLAYED_NONCE)
    assert g.nonces.seen(g.check("POST", "/x", signed(), b"{}").address, h["x-nonce"], NOW + 300)
    assert not g.nonces.seen("x", h["x-nonce"], NOW + 302)


@pytest.mark.parametrize("offset, code", [(-301, ErrorCode.STALE_TIMESTAMP),
                                          (301, ErrorCode.FUTURE_TIMESTAMP)])
def test_timestamps_outside_window(offset: int, code: ErrorCode) -> None:
    g = guard()
    e = refused(g, signed(timestamp=NOW + offset))
    assert (e.status, e.code) == (401, code)
    assert len(g.nonces) == 0


def test_forged_signature_and_other_address() -> None:
    g = guard()
    h = signed()
    h["x-signature"] = h["x-signature"][:-4] + ("1b" if h["x-signature"][-2:] != "1b" else "1c") \
        + h["x-signature"][-2:]
    assert refused(g, h).status == 401
    h = signed(KEY_B)
    h["x-address"] = signed(KEY_A)["x-address"]
    e = refused(g, h)
    assert (e.status, e.code) == (401, ErrorCode.WRONG_SIGNER)
    assert len(g.nonces) == 0 and g.verified == 2


def test_tampered_path_or_body() -> None:
    g = guard()
    e = refused(g, signed(path="/x"), path="/y")
    assert e.code is ErrorCode.WRONG_SIGNER
    e = refused(g, signed(body=b'{"a":1}'), body=b'{"a":2}')
    assert (e.status, e.code) == (400, ErrorCode.BODY_SHA256_MISMATCH)


def test_oversized_body_is_413_before_any_signature_work() -> None:
    g = guard(max_body_bytes=10)
    body = json.dumps({"k": "v" * 20}).encode()
    e = refused(g, signed(body=body), body=body)
    assert (e.status, g.verified) == (413, 0)


@pytest.mark.parametrize("header, value, code", [
    ("x-address", "0x123", ErrorCode.MALFORMED_ADDRESS),
    ("x-nonce", "a b", ErrorCode.MALFORMED_NONCE),
    ("x-timestamp", "-5", ErrorCode.MALFORMED_TIMESTAMP),
    ("x-signature", "0xzz", ErrorCode.BAD_SIGNATURE),
])
def test_malformed_headers(header: str, value: str, code: ErrorCode) -> None:
    h = signed()
    h[header] = value
    assert refused(guard(), h).code is code


def test_missing_headers() -> None:
    h = signed()
    del h["x-signature"]
    assert refused(guard(), h).code is ErrorCode.MISSING_SIGNATURE


def test_rate_limit_per_address() -> None:
    g = guard(rate_per_minute=60, rate_burst=3)
    for _ in range(3):
        g.check("POST", "/x", signed(), b"{}")
    e = refused(g, signed())
    assert (e.status, e.code) == (429, ErrorCode.RATE_LIMITED)
    g.check("POST", "/x", signed(KEY_B), b"{}")  # another address is still served
    g.clock = lambda: NOW + 1.0  # one token per second comes back
    g.check("POST", "/x", signed(timestamp=NOW + 1), b"{}")
