"""Shard transports: how the client moves one shard's bytes from a server into a ShardReceiver.

`RawHttpTransport` (the default) speaks the little HTTP/1.1 that a shard GET needs over asyncio
`BufferedProtocol`s, so the kernel writes the body straight into the receiver's piece buffer:
about twice the throughput of a general-purpose client on loopback, where CPU, not the network,
is the limit. Connections are kept alive and reused per server. `AiohttpTransport` does the same
through an aiohttp session (for proxies, TLS, or tests). Both resume at `rx.filled` with a
`Range` request and keep what arrived when a transfer breaks.

`ShardReceiver` (`receiver.py`, re-exported here) verifies a shard piece by piece.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from meshrl.shardcast.receiver import PieceMismatchError, ShardReceiver, TransferError

__all__ = [
    "PREEMPTIBLE_HEADER",
    "PROGRESS_HEADER",
    "RELAY_HEADER",
    "AiohttpTransport",
    "PieceMismatchError",
    "RawHttpTransport",
    "ShardReceiver",
    "ShardTransport",
    "TransferError",
]

_HEAD_MAX = 64 * 1024
RELAY_HEADER = "X-Shardcast-Relay"  # sent by a relay mirroring: served before clients
# on an answer the server may cut to serve relays first: a cut then means "busy", not "broken"
PREEMPTIBLE_HEADER = "X-Shardcast-Preemptible"
# a client's fraction of the version already held: servers serve the furthest behind first
PROGRESS_HEADER = "X-Shardcast-Progress"


def _preempted() -> TransferError:
    return TransferError("stream cut by the server to serve relays", 503, 1.0)


def _retry_after(value: str | None) -> float:
    """A Retry-After header in seconds (0 if absent or a date)."""
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0


class ShardTransport(Protocol):
    async def fetch(self, url: str, rx: ShardReceiver, stall_timeout: float,
                    headers: dict[str, str] | None = None) -> None:
        """Receive the rest of a shard from `url` into `rx`, from `rx.filled`; raise on failure.
        `headers` are sent with this request only."""

    async def close(self) -> None: ...


class _Response(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray(_HEAD_MAX)
        self.head_n = 0
        self.in_body = False
        self.rx: ShardReceiver | None = None
        self.expect = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.done: asyncio.Future[None] | None = None
        self.closed = False
        self.paused = False

    def start(self, rx: ShardReceiver) -> asyncio.Future[None]:
        self.head_n, self.in_body, self.rx, self.status, self.headers = 0, False, rx, 0, {}
        self.done = asyncio.get_running_loop().create_future()
        rx.on_space = lambda: self._resume(rx)
        rx.on_abort = lambda exc: self._fail(exc) if self.rx is rx else None
        self._resume(rx)
        return self.done

    def _resume(self, rx: ShardReceiver) -> None:
        if self.paused and self.rx is rx and self.transport is not None:
            self.paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        rx = self.rx
        if self.in_body and rx is not None and rx.filled < self.expect:
            return rx.get_buffer()[: self.expect - rx.filled]
        if self.head_n >= _HEAD_MAX:  # never hand out an empty buffer (a full head fails)
            self.head_n = 0
        return memoryview(self.head)[self.head_n :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.done is None or self.done.done():
            return self._fail(TransferError("unexpected data"))
        rx = self.rx
        assert rx is not None
        if self.in_body:
            if not rx.received(nbytes):
                self._pause()
        else:
            self.head_n += nbytes
            end = self.head.find(b"\r\n\r\n", 0, self.head_n)
            if end < 0:
                if self.head_n >= _HEAD_MAX:
                    self._fail(TransferError("response headers too large"))
                return
            try:
                self._parse_head(bytes(self.head[:end]))
            except TransferError as e:
                return self._fail(e)
            if not self.in_body:
                return self._fail(TransferError(f"HTTP {self.status}", self.status,
                                                _retry_after(self.headers.get("retry-after"))))
            extra = memoryview(self.head)[end + 4 : self.head_n]
            if len(extra) > self.expect - rx.filled:
                return self._fail(TransferError("more data than Content-Length"))
            if extra and not rx.feed(extra):
                self._pause()
        if rx.filled >= self.expect and not self.done.done():
            self.done.set_result(None)

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not (parts[1].isascii() and parts[1].isdigit()):
            raise TransferError(f"bad status line {lines[0]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        rx = self.rx
        assert rx is not None
        if self.status not in (200, 206):
            return
        try:
            length = int(self.headers.get("content-length", "-1"))
        except ValueError:
            raise TransferError("bad Content-Length") from None
        if self.status == 200:
            rx.restart()
        elif not self.headers.get("content-range", "").startswith(f"bytes {rx.filled}-"):
            raise TransferError("bad Content-Range")
        if length < 0 or rx.filled + length > rx.size:
            raise TransferError(f"body of {length} bytes does not fit the shard")
        self.expect = rx.filled + length
        self.in_body = True

    def _fail(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionResetError(f"connection lost: {exc}"))


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


class RawHttpTransport:
    """Minimal keep-alive HTTP/1.1 GET client writing bodies straight into piece buffers."""

    def __init__(self, connect_timeout: float = 5.0, headers: dict[str, str] | None = None
                 ) -> None:
        self.connect_timeout = connect_timeout
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: dict[tuple[str, int], list[_Response]] = {}

    async def _connect(self, host: str, port: int) -> _Response:
        idle = self._idle.get((host, port), [])
        while idle:
            proto = idle.pop()
            if not proto.closed:
                return proto
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(_Response, host, port), self.connect_timeout)
        return proto

    async def fetch(self, url: str, rx: ShardReceiver, stall_timeout: float,
                    headers: dict[str, str] | None = None) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise TransferError(f"RawHttpTransport speaks plain http only: {url}")
        port = u.port or 80
        proto = await self._connect(u.hostname, port)
        done = proto.start(rx)
        extra = self._extra + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        req = (f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nRange: bytes={rx.filled}-\r\n"
               f"{extra}\r\n")
        assert proto.transport is not None
        proto.transport.write(req.encode("latin-1"))
        ok = False
        try:
            try:
                await self._wait(done, rx, stall_timeout, u.netloc)
            except OSError as e:  # includes a stall (TimeoutError)
                if proto.in_body and proto.headers.get(PREEMPTIBLE_HEADER.lower()):
                    raise _preempted() from e
                raise
            ok = proto.headers.get("connection", "").lower() != "close"
        finally:
            if ok:
                self._idle.setdefault((u.hostname, port), []).append(proto)
            else:
                if proto.transport is not None:
                    proto.transport.close()
                done.add_done_callback(_consume)  # a late connection_lost is not an error

    @staticmethod
    async def _wait(done: asyncio.Future[None], rx: ShardReceiver, stall_timeout: float,
                    where: str) -> None:
        """Until the answer is in; TimeoutError after `stall_timeout` s without a byte."""
        last = -1
        while not done.done():
            if rx.filled == last:
                raise TimeoutError(f"no data from {where} for {stall_timeout}s")
            last = rx.filled
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(done), stall_timeout)
        done.result()

    async def close(self) -> None:
        for protos in self._idle.values():
            for p in protos:
                if p.transport is not None:
                    p.transport.close()
        self._idle.clear()


class AiohttpTransport:
    """The same contract through an aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, headers: dict[str, str] | None = None
                 ) -> None:
        self.session, self.headers = session, headers or {}

    async def fetch(self, url: str, rx: ShardReceiver, stall_timeout: float,
                    headers: dict[str, str] | None = None) -> None:
        headers = {**self.headers, **(headers or {}), "Range": f"bytes={rx.filled}-"}
        timeout = aiohttp.ClientTimeout(sock_read=stall_timeout)
        space = asyncio.Event()
        rx.on_space, rx.on_abort = space.set, None
        async with self.session.get(url, headers=headers, timeout=timeout) as r:
            if r.status not in (200, 206):
                raise TransferError(f"HTTP {r.status}", r.status,
                                    _retry_after(r.headers.get("Retry-After")))
            if r.status == 200:
                rx.restart()
            elif not r.headers.get("Content-Range", "").startswith(f"bytes {rx.filled}-"):
                raise TransferError("bad Content-Range")
            # a server may answer with less than asked (a slice): the caller asks again
            expect = rx.filled + (r.content_length if r.content_length is not None
                                  else rx.size - rx.filled)
            try:
                async for chunk in r.content.iter_chunked(1 << 20):
                    space.clear()
                    if not rx.feed(chunk):
                        await asyncio.wait_for(space.wait(), stall_timeout)
            except (aiohttp.ClientError, OSError) as e:
                if r.headers.get(PREEMPTIBLE_HEADER):
                    raise _preempted() from e
                raise
        if rx.filled != expect:
            raise TransferError("body ended early")

    async def close(self) -> None:
        return None
