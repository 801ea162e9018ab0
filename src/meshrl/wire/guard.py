"""The receiving side of signed requests: signature, address, timestamp window, replayed nonces,
body size and per-address rate limits. Transport-free, so every HTTP stack can use it.

Checks run cheapest-first so that an unauthenticated flood costs little: header shapes, the
audience, the timestamp window and the body size are refused before any elliptic-curve work,
and so is a source IP over its budget (or over its budget for signers the guard has no state
for: fresh keys cost nothing to make). A signer's own rate limit is charged only for a request
that passed every check, signature, timestamp and nonce (else anyone could spend another's
budget by writing its address in a header, or by replaying its requests); the nonce is
remembered last, so a refused request does not burn it. Every table is bounded: buckets idle
for `state_ttl_s` are evicted, nonces expire with their window.

Nonces are kept until their timestamp window closes, in a `NonceStore`: in memory by default (a
restarted server forgets them), or a `SqliteNonceStore` in the service's own database, which the
services use so that a request captured before a restart (even `kill -9`) cannot be replayed.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import Field

from meshrl.config import Config
from meshrl.wire.errors import ErrorCode, WireError
from meshrl.wire.nonces import NonceStore
from meshrl.wire.signing import (
    AUDIENCE_RE,
    HEADER_ADDRESS,
    HEADER_AUDIENCE,
    HEADER_BODY_SHA256,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    NONCE_RE,
    UNBOUND_AUDIENCE,
    recover_signer,
    request_message,
)

__all__ = ["GuardConfig", "RateLimiter", "RequestGuard", "VerifiedRequest"]

_HEX40 = frozenset("0123456789abcdefABCDEF")


class GuardConfig(Config):
    max_skew_s: int = Field(300, ge=1, description="refuse timestamps further than this from now")
    rate_per_minute: int = Field(600, ge=1, description="requests per minute per address (429)")
    rate_burst: int = Field(60, ge=1, description="requests one address may send at once")
    max_body_bytes: int = Field(1 << 20, ge=0, description="default body size limit per request")
    # per source IP, checked before any signature work: the only identity a peer cannot mint
    ip_rate_per_minute: int = Field(60_000, ge=1, description="signed requests per minute per "
                                    "source IP address (429 ip_rate_limited)")
    ip_burst: int = Field(6_000, ge=1, description="signed requests one IP may send at once")
    new_signers_per_minute: int = Field(120, ge=1, description="requests per minute per IP "
                                        "from signers the guard holds no state for (and the "
                                        "service does not know)")
    new_signer_burst: int = Field(60, ge=1, description="such requests one IP may send at once")
    new_signers_total_per_minute: int = Field(1_200, ge=1, description="such requests per "
                                              "minute from all IPs together (many IPs minting "
                                              "keys share this)")
    new_signer_total_burst: int = Field(300, ge=1, description="such requests all IPs "
                                        "together may send at once")
    docs_per_minute: int = Field(60, ge=1, description="unsigned `/openapi.json` reads per "
                                 "minute per IP (429 ip_rate_limited)")
    state_ttl_s: float = Field(600.0, gt=0, description="seconds an idle signer's or IP's rate "
                               "state is kept (then evicted)")
    # connections (read by `meshrl.wire.service.listen`)
    max_connections: int = Field(4096, ge=1, description="open connections in all (also kept "
                                 "below the process's file descriptor limit)")
    max_connections_per_ip: int = Field(256, ge=1, description="open connections per source IP")
    header_timeout_s: float = Field(10.0, gt=0, description="seconds to send a request's head")
    body_timeout_s: float = Field(60.0, gt=0, description="seconds to send a (JSON) body")
    body_idle_s: float = Field(30.0, gt=0, description="seconds a body (streamed uploads "
                               "included) may go without a byte")
    keepalive_s: float = Field(75.0, gt=0, description="seconds an idle connection is kept")


@dataclass(frozen=True)
class VerifiedRequest:
    """Who sent a request that passed every check, and the body hash it signed."""

    address: str
    body_sha256: str
    nonce: str
    timestamp: int


class RateLimiter:
    """A token bucket per key: `per_minute` sustained, `burst` at once. A bucket idle for
    `ttl_s` (and long enough to have refilled) is evicted: it is the same as a fresh one, so a
    stream of one-off keys leaves no state behind."""

    def __init__(self, per_minute: int, burst: int, ttl_s: float = 600.0) -> None:
        self.rate, self.burst = per_minute / 60.0, float(burst)
        self.ttl_s = max(ttl_s, self.burst / self.rate)
        # key -> (tokens, last time), in order of last use (re-inserted on every use)
        self._buckets: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, key: str) -> bool:
        return key in self._buckets

    def allow(self, key: str, now: float) -> bool:
        self.evict(now)
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True

    def evict(self, now: float) -> None:
        """Drop the buckets idle for `ttl_s` (the oldest first: amortized O(1) per call)."""
        buckets = self._buckets
        while buckets:
            key = next(iter(buckets))
            if now - buckets[key][1] < self.ttl_s:
                return
            del buckets[key]


_TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)  # `str.isdigit` takes any script's digits


class RequestGuard:
    """Verifies one request's headers and body; raises `WireError` with the refusal's code.

    `audience` is this service's identity (`meshrl.wire.signing.orchestrator_audience`, ...):
    a request must be signed for it."""

    def __init__(self, cfg: GuardConfig, clock: Callable[[], float] = time.time,
                 nonces: NonceStore | None = None, audience: str = UNBOUND_AUDIENCE,
                 known: Callable[[str], bool] | None = None) -> None:
        if not AUDIENCE_RE.match(audience):
            raise ValueError(f"not a valid audience: {audience!r}")
        self.cfg, self.clock, self.audience = cfg, clock, audience
        # the service's own word that an address is no stranger (a pool's member, a reader):
        # it pays no newcomer budget, so a flood of fresh keys never delays a known signer's
        # first request (after a restart, say)
        self.known = known or (lambda _address: False)
        self.nonces = NonceStore() if nonces is None else nonces
        self.limiter = RateLimiter(cfg.rate_per_minute, cfg.rate_burst, cfg.state_ttl_s)
        self.ip_limiter = RateLimiter(cfg.ip_rate_per_minute, cfg.ip_burst, cfg.state_ttl_s)
        self.newcomers = RateLimiter(cfg.new_signers_per_minute, cfg.new_signer_burst,
                                     cfg.state_ttl_s)
        self.all_newcomers = RateLimiter(cfg.new_signers_total_per_minute,
                                         cfg.new_signer_total_burst, cfg.state_ttl_s)
        self.verify_seconds = 0.0  # CPU time spent recovering signatures (the benchmark reports it)
        self.verified = 0

    def sizes(self) -> dict[str, int]:
        """How much state the guard holds (all of it bounded by the rates above)."""
        return {"nonces": len(self.nonces), "signer_buckets": len(self.limiter),
                "ip_buckets": len(self.ip_limiter), "newcomer_buckets": len(self.newcomers)}

    def check_headers(
        self, method: str, path: str, headers: Mapping[str, str], body_size: int | None,
        max_body: int | None = None, peer: str = "",
    ) -> VerifiedRequest:
        """Everything but the body hash: call before reading a (possibly streamed) body.
        `peer` is the source IP address (its budget is charged before any signature work)."""
        limit = self.cfg.max_body_bytes if max_body is None else max_body
        if body_size is not None and body_size > limit:
            raise WireError(ErrorCode.BODY_TOO_LARGE, f"{body_size} > {limit} bytes")
        address, sig, nonce, ts, digest, audience = (headers.get(h) for h in (
            HEADER_ADDRESS, HEADER_SIGNATURE, HEADER_NONCE, HEADER_TIMESTAMP, HEADER_BODY_SHA256,
            HEADER_AUDIENCE))
        if not (address and sig and nonce and ts and digest and audience):
            raise WireError(ErrorCode.MISSING_SIGNATURE)
        if audience != self.audience:
            raise WireError(ErrorCode.WRONG_AUDIENCE, f"this is {self.audience}")
        claimed = _parse_address(address)
        if not NONCE_RE.match(nonce):
            raise WireError(ErrorCode.MALFORMED_NONCE)
        if not _TIMESTAMP.fullmatch(ts):
            raise WireError(ErrorCode.MALFORMED_TIMESTAMP)
        if len(digest) != 64 or not set(digest) <= _HEX40:
            raise WireError(ErrorCode.MALFORMED_BODY_SHA256)
        timestamp, now = int(ts), self.clock()
        if timestamp < now - self.cfg.max_skew_s:
            raise WireError(ErrorCode.STALE_TIMESTAMP, f"{now - timestamp:.0f} s old")
        if timestamp > now + self.cfg.max_skew_s:
            raise WireError(ErrorCode.FUTURE_TIMESTAMP, f"{timestamp - now:.0f} s ahead")
        # the source IP pays for the signature work, and a signer with no state yet pays from
        # its IP's (smaller) budget for newcomers: minting keys costs nothing, addresses do
        if not self.ip_limiter.allow(peer, now):
            raise WireError(ErrorCode.IP_RATE_LIMITED,
                            f"{self.cfg.ip_rate_per_minute} requests per minute")
        self.limiter.evict(now)
        if claimed not in self.limiter and not self.known(claimed):
            # a stranger: its IP's newcomer budget, then every IP's together (keys minted on
            # many IPs), both before any signature work
            if not self.newcomers.allow(peer, now):
                raise WireError(ErrorCode.IP_RATE_LIMITED,
                                f"{self.cfg.new_signers_per_minute} new signers per minute")
            if not self.all_newcomers.allow("", now):
                total = self.cfg.new_signers_total_per_minute
                raise WireError(ErrorCode.IP_RATE_LIMITED,
                                f"{total} new signers per minute from all addresses")
        signer = self._recover(
            request_message(method, path, digest, nonce, timestamp, self.audience), sig)
        if signer.lower() != claimed:
            raise WireError(ErrorCode.WRONG_SIGNER)
        # only a request that passed every check is charged to its signer: a replay (or any
        # forgery) of someone's request cannot spend their budget
        if self.nonces.seen(signer, nonce, now):
            raise WireError(ErrorCode.REPLAYED_NONCE)
        if not self.limiter.allow(claimed, now):
            raise WireError(ErrorCode.RATE_LIMITED,
                            f"{self.cfg.rate_per_minute} requests per minute")
        self.nonces.add(signer, nonce, timestamp + self.cfg.max_skew_s + 1)
        return VerifiedRequest(signer, digest.lower(), nonce, timestamp)

    def check(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes,
        max_body: int | None = None, peer: str = "",
    ) -> VerifiedRequest:
        """A whole request whose body is in memory: headers, then the body's sha256."""
        declared = headers.get(HEADER_BODY_SHA256, "")
        if declared and hashlib.sha256(body).hexdigest() != declared.lower():
            # refused before the signature so that no nonce is burnt by a mangled body
            limit = self.cfg.max_body_bytes if max_body is None else max_body
            if len(body) > limit:
                raise WireError(ErrorCode.BODY_TOO_LARGE, f"{len(body)} > {limit} bytes")
            raise WireError(ErrorCode.BODY_SHA256_MISMATCH)
        return self.check_headers(method, path, headers, len(body), max_body, peer)

    def _recover(self, message: bytes, sig: str) -> str:
        try:
            raw = bytes.fromhex(sig.removeprefix("0x"))
        except ValueError:
            raise WireError(ErrorCode.BAD_SIGNATURE, "not hex") from None
        t0 = time.thread_time()  # CPU time: a busy machine's waits are not the check's cost
        try:
            return recover_signer(message, raw)
        except ValueError as e:
            raise WireError(ErrorCode.BAD_SIGNATURE, str(e)) from None
        finally:
            self.verify_seconds += time.thread_time() - t0
            self.verified += 1


def _parse_address(address: str) -> str:
    body = address.removeprefix("0x")
    if len(address) != 42 or not address.startswith("0x") or not set(body) <= _HEX40:
        raise WireError(ErrorCode.MALFORMED_ADDRESS)
    return address.lower()
