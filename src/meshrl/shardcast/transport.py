"""Shard transports: how the client moves one shard's bytes from a server into memory.

`RawHttpTransport` (the default) speaks the little HTTP/1.1 that a shard GET needs over asyncio
`BufferedProtocol`s, so the kernel writes the body straight into the shard's preallocated buffer:
about twice the throughput of a general-purpose client on loopback, where CPU, not the network,
is the limit. Connections are kept alive and reused per server. `AiohttpTransport` does the same
through an aiohttp session (for proxies, TLS, or tests). Both resume at `buf.filled` with a
`Range` request and keep what arrived when a transfer breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

__all__ = ["AiohttpTransport", "RawHttpTransport", "ShardBuffer", "ShardTransport", "TransferError"]

_HEAD_MAX = 64 * 1024


class TransferError(Exception):
    """A shard transfer that failed (HTTP status, short body, bad Content-Range...)."""

    def __init__(self, msg: str, status: int | None = None) -> None:
        super().__init__(msg)
        self.status = status


class ShardBuffer:
    """Memory for one shard: `data[:filled]` holds the bytes received so far."""

    def __init__(self, capacity: int) -> None:
        self.data = bytearray(capacity)
        self.size = capacity
        self.filled = 0

    def reset(self, size: int) -> None:
        if size > len(self.data):
            self.data = bytearray(size)
        self.size, self.filled = size, 0

    def view(self) -> memoryview:
        return memoryview(self.data)[: self.size]


class ShardTransport(Protocol):
    async def fetch(self, url: str, buf: ShardBuffer, stall_timeout: float) -> None:
        """Fill `buf` from `url`, resuming at `buf.filled`; raise on any failure."""

    async def close(self) -> None: ...


class _Response(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray(_HEAD_MAX)
        self.head_n = 0
        self.body: memoryview | None = None
        self.buf: ShardBuffer | None = None
        self.expect = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.done: asyncio.Future[None] | None = None
        self.closed = False

    def start(self, buf: ShardBuffer) -> asyncio.Future[None]:
        self.head_n, self.body, self.buf, self.status, self.headers = 0, None, buf, 0, {}
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None and self.buf is not None and self.buf.filled < self.expect:
            return self.body[self.buf.filled : self.expect]
        return memoryview(self.head)[self.head_n :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.done is None or self.done.done():
            return self._fail(TransferError("unexpected data"))
        assert self.buf is not None
        if self.body is not None:
            self.buf.filled += nbytes
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
            extra = self.head_n - end - 4
            if extra and self.body is not None:
                at, take = self.buf.filled, min(extra, self.expect - self.buf.filled)
                if take < extra:
                    return self._fail(TransferError("more data than Content-Length"))
                self.body[at : at + take] = self.head[end + 4 : end + 4 + take]
                self.buf.filled += take
            if self.body is None:
                return self._fail(TransferError(f"HTTP {self.status}", self.status))
        if self.buf.filled >= self.expect:
            self.done.set_result(None)

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise TransferError(f"bad status line {lines[0]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        buf = self.buf
        assert buf is not None
        if self.status not in (200, 206):
            return
        try:
            length = int(self.headers.get("content-length", "-1"))
        except ValueError:
            raise TransferError("bad Content-Length") from None
        if self.status == 200:
            buf.filled = 0
        elif not self.headers.get("content-range", "").startswith(f"bytes {buf.filled}-"):
            raise TransferError("bad Content-Range")
        if length < 0 or buf.filled + length > buf.size:
            raise TransferError(f"body of {length} bytes does not fit the shard")
        self.expect = buf.filled + length
        self.body = buf.view()

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
    """Minimal keep-alive HTTP/1.1 GET client writing bodies straight into shard buffers."""

    def __init__(self, connect_timeout: float = 5.0) -> None:
        self.connect_timeout = connect_timeout
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

    async def fetch(self, url: str, buf: ShardBuffer, stall_timeout: float) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise TransferError(f"RawHttpTransport speaks plain http only: {url}")
        port = u.port or 80
        proto = await self._connect(u.hostname, port)
        done = proto.start(buf)
        rng = f"Range: bytes={buf.filled}-\r\n" if buf.filled else ""
        req = f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\n{rng}\r\n"
        assert proto.transport is not None
        proto.transport.write(req.encode("latin-1"))
        ok = False
        try:
            last = -1
            while not done.done():
                if buf.filled == last:
                    raise TimeoutError(f"no data from {u.netloc} for {stall_timeout}s")
                last = buf.filled
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), stall_timeout)
            done.result()
            ok = proto.headers.get("connection", "").lower() != "close"
        finally:
            if ok:
                self._idle.setdefault((u.hostname, port), []).append(proto)
            else:
                if proto.transport is not None:
                    proto.transport.close()
                done.add_done_callback(_consume)  # a late connection_lost is not an error

    async def close(self) -> None:
        for protos in self._idle.values():
            for p in protos:
                if p.transport is not None:
                    p.transport.close()
        self._idle.clear()


class AiohttpTransport:
    """The same contract through an aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def fetch(self, url: str, buf: ShardBuffer, stall_timeout: float) -> None:
        headers = {"Range": f"bytes={buf.filled}-"} if buf.filled else {}
        timeout = aiohttp.ClientTimeout(sock_read=stall_timeout)
        async with self.session.get(url, headers=headers, timeout=timeout) as r:
            if r.status not in (200, 206):
                raise TransferError(f"HTTP {r.status}", r.status)
            if r.status == 200:
                buf.filled = 0
            elif not r.headers.get("Content-Range", "").startswith(f"bytes {buf.filled}-"):
                raise TransferError("bad Content-Range")
            view = buf.view()
            async for chunk in r.content.iter_chunked(1 << 20):
                if buf.filled + len(chunk) > buf.size:
                    raise TransferError("body longer than the shard")
                view[buf.filled : buf.filled + len(chunk)] = chunk
                buf.filled += len(chunk)
        if buf.filled != buf.size:
            raise TransferError("body ended early")

    async def close(self) -> None:
        return None
