"""The shardcast HTTP server, shared by origins and relays (aiohttp, one event loop).

URL layout (see docs/shardcast.md):

    GET /health                          status, versions, byte counters, polls held, streams
    GET /versions?after=N&wait=S         versions held; long-polls up to S s for one newer than N
    GET /v/{N}/manifest                  the manifest (JSON, canonical bytes)
    GET /v/{N}/have                      shards this server can serve now
    GET /v/{N}/shard/{i}                 shard bytes; `Range: bytes=a-[b]` within the shard

A relay's partial version is listed and its manifest served, but a shard is served only after it
was verified and written; unknown versions and shards not held yet answer 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web

from meshrl.log import get_logger, log_event
from meshrl.shardcast.config import ServerConfig
from meshrl.shardcast.ratelimit import TokenBucket
from meshrl.shardcast.store import VersionStore
from meshrl.shardcast.transport import PREEMPTIBLE_HEADER, PROGRESS_HEADER, RELAY_HEADER
from meshrl.wire.errors import ErrorCode, WireError

__all__ = ["ShardServer"]

log = get_logger("meshrl.shardcast.server")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`bytes=a-` / `bytes=a-b` (inclusive) → [start, end); None if absent; ValueError if bad."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    first, _, last = spec.partition("-")
    if unit.strip() != "bytes" or "," in spec or not first.strip().isdigit():
        raise ValueError(header)
    start = int(first)
    end = int(last) + 1 if last.strip() else size
    if start >= size or end <= start:
        raise ValueError(header)
    return start, min(end, size)


class ShardServer:
    """Serves one VersionStore over HTTP; `notify()` wakes long-polls after the store changed."""

    def __init__(self, store: VersionStore, cfg: ServerConfig, role: str = "origin") -> None:
        self.store, self.cfg, self.role = store, cfg, role
        self.counters: Counter[str] = Counter()
        self.step = _step(cfg)
        self.bucket = (TokenBucket(cfg.upload_rate, _burst(cfg.upload_rate, self.step))
                       if cfg.upload_rate > 0 else None)
        self._sliced = cfg.serve_clients == "spare" and self.bucket is not None
        self._conn_buckets: weakref.WeakKeyDictionary[Any, TokenBucket] = (
            weakref.WeakKeyDictionary())
        self.first_serve: dict[int, float] = {}  # version -> time its first shard was served
        self.pipelined: Counter[int] = Counter()  # shards served while the version was partial
        self.info: dict[str, Any] = {}  # extra fields for /health (a relay's mirror timings)
        # gauges for /health: long polls waiting now, shard answers in progress by class
        self.held_polls = 0
        self.streams_open: Counter[str] = Counter({"relays": 0, "clients": 0})
        self._changed = asyncio.Event()
        self._closing = False  # set by `stop`: a held long poll answers at once
        self._runner: web.AppRunner | None = None
        self._scanner: asyncio.Task[None] | None = None
        self.url = ""

    # ---- lifecycle ----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/versions", self.versions)
        # ASCII digits, bounded: `\d` takes any script's digits, and int() of 5000 digits raises
        app.router.add_get("/v/{version:[0-9]{1,19}}/manifest", self.manifest)
        app.router.add_get("/v/{version:[0-9]{1,19}}/have", self.have)
        app.router.add_get("/v/{version:[0-9]{1,19}}/shard/{index:[0-9]{1,9}}", self.shard)
        return app

    async def start(self) -> str:
        # a stop waits at most SHUTDOWN_S for requests in flight (a shard being served); held
        # long polls are answered at once (`stop`), so no peer can hold the stop for 60 s
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                     shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, reuse_address=True)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        self._scanner = asyncio.create_task(self._scan_loop())
        log_event(log, "shardcast server up", role=self.role, url=self.url,
                  root=str(self.store.root))
        return self.url

    async def stop(self) -> None:
        """Stop serving: held long polls are answered now (with what is held), then the
        listener closes; a request still in flight gets `SHUTDOWN_S`."""
        self._closing = True
        self.notify()
        if self._scanner:
            self._scanner.cancel()
        if self._runner:
            await self._runner.cleanup()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _scan_loop(self) -> None:
        """Pick up versions written by another process (`meshrl shardcast publish`)."""
        while True:
            await asyncio.sleep(self.cfg.scan_interval)
            if self.store.scan():
                log_event(log, "versions", role=self.role, complete=sorted(self.store.complete))
                self.notify()

    # ---- handlers -----------------------------------------------------------------------
    def _listing(self) -> dict[str, Any]:
        return {
            "latest": self.store.latest(),
            "complete": sorted(self.store.complete),
            "partial": sorted(self.store.partial),
        }

    async def health(self, request: web.Request) -> web.Response:
        partial = {str(v): len(p.have) for v, p in self.store.partial.items()}
        return web.json_response({
            "status": "ok", "role": self.role, **self._listing(), "partial_shards": partial,
            "counters": dict(self.counters),
            "first_serve": {str(v): t for v, t in self.first_serve.items()},
            "pipelined_shards": {str(v): n for v, n in self.pipelined.items()},
            "held_polls": self.held_polls, "streams_open": dict(self.streams_open),
            "clients_admitted": self._refusal(relay=False) is None,
            **self.info,
        })

    async def versions(self, request: web.Request) -> web.Response:
        after, wait = _long_poll_args(request, "after")
        deadline = time.monotonic() + wait
        while (self.store.latest() is None or self.store.latest() <= after) and (
            left := deadline - time.monotonic()
        ) > 0 and not self._closing:
            await self._hold(left)  # the scan loop or a mirror notifies
        return web.json_response(self._listing())

    async def _hold(self, seconds: float) -> None:
        """Wait up to `seconds` for the store to change, counted in `held_polls`."""
        self.held_polls += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), seconds)
        finally:
            self.held_polls -= 1

    def _version(self, request: web.Request) -> int:
        v = int(request.match_info["version"])
        if self.store.manifest(v) is None:
            raise web.HTTPNotFound(text=f"version {v} not held")
        return v

    async def manifest(self, request: web.Request) -> web.Response:
        m = self.store.manifest(self._version(request))
        assert m is not None
        return web.Response(body=m.to_json(), content_type="application/json")

    async def have(self, request: web.Request) -> web.Response:
        """Shards held; with `known=K&wait=S`, waits up to S s until more than K are held."""
        known, wait = _long_poll_args(request, "known")
        deadline = time.monotonic() + wait
        while True:
            v = self._version(request)
            if v in self.store.complete:
                return web.json_response({"complete": True, "have": None, "role": self.role})
            have = self.store.partial[v].have
            left = deadline - time.monotonic()
            if len(have) > known or left <= 0 or self._closing:
                return web.json_response({"complete": False, "have": sorted(have),
                                          "role": self.role})
            await self._hold(left)

    def _is_relay(self, request: web.Request) -> bool:
        claim = request.headers.get(RELAY_HEADER)
        return claim is not None and (not self.cfg.relay_token or claim == self.cfg.relay_token)

    def _refusal(self, relay: bool) -> Literal["never", "busy"] | None:
        """Why a shard request would be refused now (None: it is admitted): "never" (this
        server keeps its upload for relays), "busy" (spare mode, relays saturate the upload)."""
        mode = self.cfg.serve_clients
        if relay or mode == "always":
            return None
        if mode == "never":
            return "never"
        if self.bucket is not None and self.bucket.high_waited(_SPARE_WINDOW):
            return "busy"
        return None

    def _admit(self, relay: bool) -> None:
        """Refuse a client's shard request when this server keeps its upload for relays."""
        why = self._refusal(relay)
        if why == "never":
            self.counters["client_refusals"] += 1
            raise web.HTTPForbidden(text="this server serves shards to relays only")
        if why == "busy":
            self.counters["busy_refusals"] += 1
            raise web.HTTPServiceUnavailable(
                text="upload saturated by relays", headers={"Retry-After": str(_RETRY_AFTER)})

    async def shard(self, request: web.Request) -> web.StreamResponse:
        v, i = self._version(request), int(request.match_info["index"])
        self.counters["shard_requests"] += 1
        partial = v in self.store.partial
        if not self.store.has_shard(v, i):
            self.counters["shard_misses"] += 1
            raise web.HTTPNotFound(text=f"version {v} shard {i} not held")
        relay = self._is_relay(request)
        self._admit(relay)
        streams = "relays" if relay else "clients"
        self.streams_open[streams] += 1
        try:
            return await self._serve_shard(request, v, i, partial, relay)
        finally:
            self.streams_open[streams] -= 1

    async def _serve_shard(self, request: web.Request, v: int, i: int, partial: bool,
                           relay: bool) -> web.StreamResponse:
        """The shard's bytes (a range of them), throttled where a rate is set."""
        with self.store.open_shard(v, i) as (fd, offset, size):
            try:
                rng = _parse_range(request.headers.get("Range"), size)
            except ValueError:
                raise web.HTTPRequestRangeNotSatisfiable(
                    headers={"Content-Range": f"bytes */{size}"}
                ) from None
            start, end = rng or (0, size)
            if rng and not relay and self._sliced:  # the rest is asked for again (or refused)
                end = min(end, start + self.cfg.spare_slice)
            resp = web.StreamResponse(status=206 if rng else 200)
            resp.content_length = end - start
            resp.content_type = "application/octet-stream"
            resp.headers["X-Shard-Sha256"] = self.store.manifest(v).shards[i].sha256  # type: ignore[union-attr]
            if not relay and self.bucket is not None:
                resp.headers[PREEMPTIBLE_HEADER] = "1"
            if rng:
                self.counters["range_requests"] += start > 0
                resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            if self.bucket is None and self.cfg.connection_rate <= 0:
                await resp.prepare(request)
                self._first_bytes(v, partial)
                await self._sendfile(request, fd, offset + start, end - start)
            else:
                started = functools.partial(self._first_bytes, v, partial)
                if not await self._throttled(request, resp, fd, offset + start, end - start,
                                             relay, started):
                    return resp  # cut (the connection is closed)
            if relay:
                self.counters["bytes_sent_relays"] += end - start
            await resp.write_eof()
            self.counters["shards_served"] += 1
            return resp

    def _first_bytes(self, v: int, partial: bool) -> None:
        self.first_serve.setdefault(v, time.time())
        if partial:
            self.pipelined[v] += 1

    async def _sendfile(self, request: web.Request, fd: int, offset: int, length: int) -> None:
        """Zero-copy send (os.sendfile) of shard bytes, as aiohttp's FileResponse."""
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("connection lost")
        with open(fd, "rb", buffering=0, closefd=False) as f:
            await asyncio.get_running_loop().sendfile(transport, f, offset, length)
        self.counters["bytes_sent"] += length

    async def _throttled(self, request: web.Request, resp: web.StreamResponse, fd: int,
                         offset: int, length: int, relay: bool,
                         started: Callable[[], None]) -> bool:
        """Send in steps of `self.step` bytes, each after its tokens: the connection's, then
        the server's (relays first). A client starved longer than `preempt_after` is refused
        (503) before its first byte, or cut after it (its answer said it may be)."""
        conn = None
        if self.cfg.connection_rate > 0 and request.transport is not None:
            conn = self._conn_buckets.get(request.transport)
            if conn is None:
                rate = self.cfg.connection_rate
                conn = TokenBucket(rate, _burst(rate, self.step))
                self._conn_buckets[request.transport] = conn
        timeout = None if relay else self.cfg.preempt_after
        rank = _progress(request)
        pos = 0
        while pos < length:
            n = min(self.step, length - pos)
            if conn is not None:
                await conn.take(n)
            if self.bucket is not None:
                try:
                    await self.bucket.take(n, high=relay, timeout=timeout, rank=rank)
                except TimeoutError:
                    self.counters["preempted"] += 1
                    if pos == 0:
                        raise web.HTTPServiceUnavailable(
                            text="upload taken by relays",
                            headers={"Retry-After": str(_RETRY_AFTER)}) from None
                    if request.transport is not None:
                        request.transport.close()
                    return False
            if pos == 0:
                await resp.prepare(request)
                started()
            await self._sendfile(request, fd, offset + pos, n)
            pos += n
        return True


_SPARE_WINDOW = 0.25  # s: relays queued for upload this recently leave nothing spare
_RETRY_AFTER = 1  # s: what a client refused for lack of spare capacity is told


def _progress(request: web.Request) -> float:
    """The client's claimed fraction of the version held (0 if absent or malformed)."""
    try:
        claim = float(request.headers.get(PROGRESS_HEADER, "0"))
    except ValueError:
        return 0.0
    return min(max(claim, 0.0), 1.0) if math.isfinite(claim) else 0.0


def _burst(rate: float, step: int) -> float:
    """50 ms of the rate: a loop woken late (busy CPU) still sends what it was owed."""
    return max(2 * step, 0.05 * rate)


def _step(cfg: ServerConfig) -> int:
    """Bytes per throttled send: 10 ms of the tightest rate (fair, and few enough calls to
    cost little CPU), 16 KiB at least."""
    rates = [r for r in (cfg.upload_rate, cfg.connection_rate) if r > 0]
    if not rates:
        return cfg.chunk_size
    return min(cfg.chunk_size, max(16384, int(min(rates) / 100)))


MAX_WAIT = 60.0  # s: the longest a long-poll is held, whatever it asks for
SHUTDOWN_S = 3.0  # s: what a stop leaves a request in flight (a shard being served)


def _long_poll_args(request: web.Request, name: str) -> tuple[int, float]:
    """The `name=N&wait=S` query of a long poll: N (default -1, at most 19 digits) and S in
    [0, 60] s. Anything else (`nan`, `inf`, a number of 5000 digits) is an `invalid_query`
    refusal: a NaN deadline would never pass."""
    raw_n, raw_wait = request.query.get(name, "-1"), request.query.get("wait", "0")
    try:
        if len(raw_n) > 20 or len(raw_wait) > 32:
            raise ValueError("too long")
        n, wait = int(raw_n), float(raw_wait)
        if not math.isfinite(wait):
            raise ValueError("not finite")
    except ValueError:
        err = WireError(ErrorCode.INVALID_QUERY, f"{name} must be an integer and wait a finite "
                        "number of seconds")
        raise web.HTTPUnprocessableEntity(text=err.body().model_dump_json(),
                                          content_type="application/json") from None
    return n, min(max(wait, 0.0), MAX_WAIT)
