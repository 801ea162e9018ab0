"""Which server to ask for a shard: weighted by measured throughput and recent failures.

Each server's weight is its throughput estimate (an EWMA of bytes/s over finished transfers),
divided by its in-flight requests + 1 (so parallel shards spread out), and by 1 + 4 * its
failure score, which decays exponentially (`failure_decay` seconds) so a server that recovers is
tried again. Unmeasured servers get the best measured throughput, so every server is explored.
The choice is random in proportion to weight: one slow measurement never starves a server.
An origin's weight is further multiplied by `origin_weight` (< 1: relays are preferred, since
the origin's upload is what every relay needs too). A server that answered "busy" (503, its
upload saturated by relays) is skipped until its Retry-After passed; one that refuses clients
(403) is never asked for shards again.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from meshrl.shardcast.errors import BadServerUrl

__all__ = ["ServerPool", "ServerState"]


def _checked(url: str) -> str:
    """`url` without a trailing '/', if it is http(s)://host[:port][/path] (a server list may
    come from a work order: a port of 99999 must be a refusal now, not a ValueError mid-fetch)."""
    try:
        u = urlsplit(url)
        ok = u.scheme in ("http", "https") and bool(u.hostname) and u.port != 0
    except ValueError:  # a port out of range or not a number
        ok = False
    if not ok or u.query or u.fragment:
        raise BadServerUrl(f"shardcast: not a server URL: {url[:200]!r}")
    return url.rstrip("/")

_DEFAULT_RATE = 100e6  # bytes/s assumed before any measurement


@dataclass
class ServerState:
    url: str
    throughput: float | None = None
    failure_score: float = 0.0
    failure_time: float = 0.0
    active: int = 0
    manifest_digest: str | None = None  # None: the version's manifest not seen there yet
    complete: bool = False
    have: set[int] = field(default_factory=set)
    bytes: int = 0
    failures: int = 0
    hash_failures: int = 0
    role: str | None = None  # "origin" / "relay", as the server reports it
    busy_until: float = 0.0  # monotonic time before which it is not asked (it said 503)
    busy: int = 0
    refuses: bool = False  # it serves no shards to clients (403)
    refusals: int = 0  # answers of it not believed (unsigned manifest, malformed listing...)
    strikes: int = 0  # refusals since it last backed a listing with a signed manifest
    distrust_until: float = 0.0  # monotonic time before which its listings are ignored

    def has(self, index: int) -> bool:
        return self.complete or index in self.have

    def usable(self, digest: str, now: float) -> bool:
        return self.manifest_digest == digest and not self.refuses and now >= self.busy_until


class ServerPool:
    def __init__(self, urls: list[str], failure_decay: float = 10.0, seed: int | None = None,
                 origin_weight: float = 1.0):
        if not urls:
            raise BadServerUrl("shardcast: at least one server URL is needed")
        self.servers = {_checked(u): ServerState(_checked(u)) for u in urls}
        self.failure_decay, self.origin_weight = failure_decay, origin_weight
        self.rng = random.Random(seed)

    def _failures(self, s: ServerState, now: float) -> float:
        return s.failure_score * math.exp(-(now - s.failure_time) / self.failure_decay)

    def weight(self, s: ServerState, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        known = [x.throughput for x in self.servers.values() if x.throughput]
        rate = s.throughput or (max(known) if known else _DEFAULT_RATE)
        bias = self.origin_weight if s.role == "origin" else 1.0
        return bias * rate / (1 + s.active) / (1 + 4 * self._failures(s, now))

    def available(self, index: int, digest: str) -> bool:
        now = time.monotonic()
        return any(s.usable(digest, now) and s.has(index) for s in self.servers.values())

    def choose(self, index: int, digest: str, avoid: set[str] = frozenset()) -> ServerState | None:
        """A server holding shard `index` of the manifest `digest`; avoids `avoid` if it can."""
        now = time.monotonic()
        cands = [s for s in self.servers.values() if s.usable(digest, now) and s.has(index)]
        preferred = [s for s in cands if s.url not in avoid] or cands
        if not preferred:
            return None
        weights = [self.weight(s, now) for s in preferred]
        return self.rng.choices(preferred, weights=weights)[0]

    def record_success(self, s: ServerState, nbytes: int, seconds: float,
                       measure: bool = True) -> None:
        s.bytes += nbytes
        if measure and nbytes >= 16384 and seconds > 0:
            rate = nbytes / seconds
            s.throughput = rate if s.throughput is None else 0.7 * s.throughput + 0.3 * rate

    def record_failure(self, s: ServerState, weight: float = 1.0, hash_mismatch: bool = False):
        now = time.monotonic()
        s.failure_score = self._failures(s, now) + weight
        s.failure_time = now
        s.failures += 1
        s.hash_failures += int(hash_mismatch)

    def record_refusal(self, s: ServerState, never: bool, retry_after: float) -> None:
        """It keeps its upload for relays (not a failure): for good (`never`, 403: no more
        shard requests), or for now (503: skip it for `retry_after` s)."""
        if never:
            s.refuses = True
            return
        s.busy_until = time.monotonic() + max(retry_after, 0.1)
        s.busy += 1

    def stats(self) -> dict[str, dict[str, float | int | str | None]]:
        return {
            s.url: {
                "bytes": s.bytes, "failures": s.failures, "hash_failures": s.hash_failures,
                "throughput": s.throughput, "busy": s.busy, "role": s.role,
                "refusals": s.refusals,
            }
            for s in self.servers.values()
        }
