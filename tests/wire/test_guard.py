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
    sig = bytearray(bytes.fromhex(h["x-signature"][2:]))
    sig[63] ^= 0x01  # the last byte of s: always a different signature (the nonce is random)
    h["x-signature"] = "0x" + sig.hex()
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


def test_replays_and_forgeries_are_not_charged_to_the_signer() -> None:
    g = guard(rate_per_minute=60, rate_burst=3)
    h = signed()
    g.check("POST", "/x", h, b"{}", peer="10.0.0.1")
    for _ in range(50):  # someone else resends it, or forges in its name
        assert refused_from(g, h, "10.0.0.2").code is ErrorCode.REPLAYED_NONCE
        forged = {**signed(KEY_B), "x-address": h["x-address"]}
        assert refused_from(g, forged, "10.0.0.2").code is ErrorCode.WRONG_SIGNER
    for _ in range(2):  # 2 of its burst of 3 are left
        g.check("POST", "/x", signed(), b"{}", peer="10.0.0.1")
    assert refused_from(g, signed(), "10.0.0.1").code is ErrorCode.RATE_LIMITED


def refused_from(g: RequestGuard, headers: dict, peer: str) -> WireError:
    with pytest.raises(WireError) as e:
        g.check("POST", "/x", headers, b"{}", peer=peer)
    return e.value


def test_the_audience_is_signed_and_checked() -> None:
    g = RequestGuard(GuardConfig(), clock=lambda: NOW, audience="meshrl/1/orchestrator/7")
    mine = signed(audience="meshrl/1/orchestrator/7")
    assert g.check("POST", "/x", mine, b"{}")
    other = signed(audience="meshrl/1/orchestrator/8")
    assert refused(g, other).code is ErrorCode.WRONG_AUDIENCE
    relabelled = {**other, "x-audience": "meshrl/1/orchestrator/7"}  # the signature says 8
    assert refused(g, relabelled).code is ErrorCode.WRONG_SIGNER
    assert refused(g, signed()).code is ErrorCode.WRONG_AUDIENCE  # unbound is not this one
    assert g.verified == 2 and len(g.nonces) == 1
    with pytest.raises(ValueError):
        RequestGuard(GuardConfig(), audience="a\nb")


@pytest.mark.parametrize("ts", ["\u0661\u0667\u0660\u0660", "\u00b9", "\uff11", "1_0", "+1",
                                "1.0", " 1", "1\n"])
def test_timestamp_digits_are_ascii(ts: str) -> None:
    h = signed()
    h["x-timestamp"] = ts
    assert refused(guard(), h).code is ErrorCode.MALFORMED_TIMESTAMP


def test_fresh_signers_pay_from_their_ips_budget_before_any_signature_work() -> None:
    g = guard(new_signer_burst=5, new_signers_per_minute=60)
    known = signed()
    g.check("POST", "/x", known, b"{}", peer="10.0.0.9")
    for i in range(5):
        g.check("POST", "/x", signed(f"0x{i + 1:064x}"), b"{}", peer="10.0.0.1")
    verified = g.verified
    for i in range(1000):
        e = refused_from(g, signed(f"0x{i + 100:064x}"), "10.0.0.1")
        assert e.code is ErrorCode.IP_RATE_LIMITED
    assert g.verified == verified  # refused before the elliptic curve
    assert g.sizes() == {"nonces": 6, "signer_buckets": 6, "ip_buckets": 2,
                         "newcomer_buckets": 2}
    # a known signer on the same IP, and a newcomer from another IP, are still served
    g.check("POST", "/x", signed(), b"{}", peer="10.0.0.1")
    g.check("POST", "/x", signed(f"0x{5000:064x}"), b"{}", peer="10.0.0.2")


def test_fresh_signers_from_many_ips_share_one_budget_and_known_ones_pay_none() -> None:
    """Keys minted on 16 IPs: past the newcomers' budget of all IPs together each is refused
    before any signature work; a signer the service knows (a member) is never charged, so it
    is served however the flood goes, its first request too."""
    member = signed(f"0x{7777:064x}")
    g = RequestGuard(GuardConfig(new_signer_burst=50, new_signers_per_minute=60,
                                 new_signer_total_burst=40, new_signers_total_per_minute=60),
                     clock=lambda: NOW, known=lambda a: a == member["x-address"].lower())
    codes: dict[str, int] = {}
    for i in range(16 * 50):
        try:
            g.check("POST", "/x", signed(f"0x{i + 1:064x}"), b"{}", peer=f"10.1.{i % 16}.1")
            codes["ok"] = codes.get("ok", 0) + 1
        except WireError as e:
            codes[e.code.value] = codes.get(e.code.value, 0) + 1
    assert codes == {"ok": 40, "ip_rate_limited": 16 * 50 - 40}, codes
    assert g.verified == 40  # the refused cost no elliptic-curve work
    g.check("POST", "/x", member, b"{}", peer="10.1.0.1")  # known: served at once
    assert refused_from(g, signed(f"0x{9999:064x}"), "10.2.0.1").code \
        is ErrorCode.IP_RATE_LIMITED  # a stranger from a fresh IP: the shared budget is spent


def test_idle_state_is_evicted() -> None:
    now = [float(NOW)]
    g = RequestGuard(GuardConfig(state_ttl_s=10, rate_per_minute=600, rate_burst=10,
                                 new_signer_burst=20_000, new_signers_per_minute=1200,
                                 new_signer_total_burst=20_000, ip_burst=20_000),
                     clock=lambda: now[0])
    for i in range(2_000):  # each a signature made and checked: 7 ms a key
        g.check("POST", "/x", signed(f"0x{i + 1:064x}"), b"{}", peer=f"10.0.{i % 250}.1")
    assert g.sizes()["signer_buckets"] == 2_000 and g.sizes()["ip_buckets"] == 250
    # past every nonce's window and every bucket's ttl (the newcomers' is their refill time,
    # 20,000 / 20 a second: a bucket is dropped only once it is as good as a fresh one)
    now[0] += 1001
    g.check("POST", "/x", signed(timestamp=int(now[0])), b"{}", peer="10.9.9.9")
    assert g.sizes() == {"nonces": 1, "signer_buckets": 1, "ip_buckets": 1,
                         "newcomer_buckets": 1}
