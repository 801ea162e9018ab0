"""A user-space link between two places (this kernel has no netem): TCP relays that add a
one-way delay to every chunk, limit the bandwidth of each direction, and can be cut (every open
connection dropped, new ones held without an answer: a black hole, as a cut cable looks) and
restored. Runs its own event loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import threading
import time

__all__ = ["Link", "setns"]

CLONE_NEWNET = 0x40000000


def setns(path: str) -> None:
    """Move the calling thread into the network namespace at `path` (/run/netns/NAME): the
    sockets it creates from now on live there (those made before stay where they were)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


class Link:
    """Relays `listen (host, port) -> target (host, port)` pairs; `delay_s` one way (so RTT is
    twice it), `rate_bps` bits per second per direction of each connection (0: unlimited)."""

    def __init__(self, pairs: list[tuple[tuple[str, int], tuple[str, int]]],
                 delay_s: float = 0.0, rate_bps: float = 0.0, listen_ns: str = "",
                 connect_ns: str = "") -> None:
        """`listen_ns` / `connect_ns`: network namespaces (paths) the listening and the
        outgoing sockets are made in: the link is then the only way between them."""
        self.pairs, self.delay_s, self.rate_bps = pairs, delay_s, rate_bps
        self.listen_ns, self.connect_ns = listen_ns, connect_ns
        self.loop = asyncio.new_event_loop()
        self.up = True
        self._conns: set[asyncio.StreamWriter] = set()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.bytes = 0

    def start(self) -> Link:
        ready = threading.Event()
        self.loop.call_soon_threadsafe(ready.set)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        assert ready.wait(10)
        return self

    @property
    def ports(self) -> list[int]:
        """The port each pair listens on, in order (a pair given port 0 gets a free one)."""
        return [srv.sockets[0].getsockname()[1] for srv in self._servers]

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _listen(self) -> None:
        if self.listen_ns:
            setns(self.listen_ns)  # the loop's thread: listeners are made there
        for (lh, lp), target in self.pairs:
            async def on(r: asyncio.StreamReader, w: asyncio.StreamWriter, t=target) -> None:
                await self._relay(r, w, t)
            self._servers.append(await asyncio.start_server(on, lh, lp))
        if self.connect_ns:
            setns(self.connect_ns)  # every connection out is made there from now on

    async def _relay(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                     target: tuple[str, int]) -> None:
        self._conns.add(w)
        try:
            while not self.up:  # black hole: hold the connection, answer nothing
                await asyncio.sleep(0.2)
                if w.is_closing():
                    return
            tr, tw = await asyncio.open_connection(*target)
        except OSError:
            w.close()
            self._conns.discard(w)
            return
        self._conns.add(tw)
        await asyncio.gather(self._pipe(r, tw), self._pipe(tr, w), return_exceptions=True)
        for x in (w, tw):
            self._conns.discard(x)
            x.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        budget_t = time.monotonic()
        try:
            while chunk := await r.read(16384):
                if not self.up:
                    break
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.rate_bps:  # the chunk leaves when the link has carried the previous
                    budget_t = max(budget_t, time.monotonic()) + len(chunk) * 8 / self.rate_bps
                    await asyncio.sleep(max(0.0, budget_t - time.monotonic()))
                if not self.up:
                    break
                w.write(chunk)
                self.bytes += len(chunk)
                await w.drain()
        finally:
            with contextlib.suppress(Exception):
                w.close()

    def cut(self) -> None:
        def go() -> None:
            self.up = False
            for w in list(self._conns):
                w.transport.abort()
            self._conns.clear()
        self.loop.call_soon_threadsafe(go)

    def restore(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "up", True)

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            self.cut()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
