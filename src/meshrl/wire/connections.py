"""Connections a peer may hold, and for how long: the part of serving that aiohttp leaves open.

aiohttp keeps a connection that sends half a request head for as long as it likes, has no cap on
connections per source or in all, and lets a body stall forever: 300 half-heads stayed open,
1,100 idle sockets exhausted the file descriptors and honest requests timed out. `GatedSite`
serves an aiohttp runner through `GatedHandler` (aiohttp's connection handler plus deadlines)
and a `ConnectionGate` (the caps); the limits are the service's `GuardConfig`.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from meshrl.log import get_logger, log_event
from meshrl.wire.errors import ErrorBody, ErrorCode
from meshrl.wire.guard import GuardConfig

log = get_logger("meshrl.wire")

__all__ = ["ConnectionGate", "GatedHandler", "GatedSite"]


class ConnectionGate:
    """Who may hold a connection: at most `max_connections_per_ip` per source IP and
    `max_connections` in all, kept below the file-descriptor limit. At a cap an idle connection
    (no request being handled) of that IP (or of all) is closed to make way: the oldest that
    never carried a request (an idle socket, a head that never ends) first, else the least
    recently active; when every one is busy the new one is dropped."""

    def __init__(self, cfg: GuardConfig) -> None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        self.cfg = cfg
        # the rest stay for the database, the chain, logs and outgoing connections
        self.max_total = max(1, min(cfg.max_connections, soft - max(64, soft // 8)))
        self.spare_fds = soft - self.max_total
        self.total = 0
        self._all: dict[GatedHandler, None] = {}  # least recently active first
        self._unserved: dict[GatedHandler, None] = {}  # no request yet, oldest first
        self._by_ip: dict[str, dict[GatedHandler, None]] = {}
        self.on_drop: Callable[[str], None] = lambda why: None

    def admit(self, conn: GatedHandler) -> bool:
        mine = self._by_ip.get(conn.peer, {})
        if len(mine) >= self.cfg.max_connections_per_ip and not self._evict(mine, mine):
            self.on_drop("ip_cap")
            return False
        if self.total >= self.max_total and not self._evict(self._unserved, self._all):
            self.on_drop("total_cap")
            return False
        self._by_ip.setdefault(conn.peer, {})[conn] = None
        self._all[conn] = None
        self._unserved[conn] = None
        self.total += 1
        return True

    def touch(self, conn: GatedHandler) -> None:
        """`conn` carries a request: it goes to the back of the eviction order."""
        if conn in self._all:
            self._unserved.pop(conn, None)
            del self._all[conn]
            self._all[conn] = None
            mine = self._by_ip[conn.peer]
            del mine[conn]
            mine[conn] = None

    def leave(self, conn: GatedHandler) -> None:
        if conn not in self._all:
            return  # left already (evicted, then its transport closed)
        del self._all[conn]
        self._unserved.pop(conn, None)
        self.total -= 1
        mine = self._by_ip[conn.peer]
        del mine[conn]
        if not mine:
            del self._by_ip[conn.peer]

    def _evict(self, first: dict[GatedHandler, None], then: dict[GatedHandler, None]) -> bool:
        for pool, unserved_only in ((first, True), (then, False)):
            for victim in pool:
                if not victim.busy and (victim.served == 0 or not unserved_only):
                    self.leave(victim)
                    victim.drop("make_way")
                    return True
        return False


class GatedHandler(RequestHandler):
    """aiohttp's connection handler with the gate and deadlines aiohttp lacks: a request's head
    must arrive within `header_timeout_s` of the connection (or of its first byte on a kept-alive
    one), and a body being sent must not stall for `body_idle_s`."""

    def __init__(self, gate: ConnectionGate, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate, self.peer, self.busy, self.served = gate, "", 0, 0
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._parsed = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.gate.admit(self):
            transport.abort()  # before aiohttp sees it: nothing to clean up but the socket
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self.gate.leave(self)
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        if self._head_timer is None and not self.busy:
            self._arm_head()  # a new head begins on a kept-alive connection
        super().data_received(data)
        if self._request_count != self._parsed:  # a whole head arrived
            self._parsed = self._request_count
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

    async def _handle_request(self, request: Any, start_time: Any, handler: Any) -> Any:
        self.busy += 1
        self.served += 1
        self.gate.touch(self)
        if not request.content.is_eof():  # a body still to come (a small one is in already)
            self._arm_body(request)
        try:
            return await super()._handle_request(request, start_time, handler)
        finally:
            self.busy -= 1
            self.gate.touch(self)
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (a bad request line, a non-ASCII URL, oversized
        headers, broken chunked framing) is a typed refusal like any other, not text, and one
        log line, never a logged traceback: a peer must not be able to fill the logs."""
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        log_event(log, "malformed request", peer=self.peer, status=status,
                  error=(message or repr(exc))[:200])  # one line, never a traceback
        body = ErrorBody(error="malformed request", code=ErrorCode.HTTP_REFUSED,
                         detail=(message or "")[:200])
        resp = web.Response(body=body.model_dump_json().encode(), status=status,
                            content_type="application/json")
        resp.force_close()
        return resp

    def drop(self, why: str) -> None:
        """Close now (a timeout or to make way): abort, no lingering."""
        self.gate.on_drop(why)
        self._cancel_timers()
        if self.transport is not None:
            self.transport.abort()

    def _arm_head(self) -> None:
        self._head_timer = self._loop.call_later(self.gate.cfg.header_timeout_s, self._head_due)

    def _head_due(self) -> None:
        self._head_timer = None
        if not self.busy:
            self.gate.leave(self)
            self.drop("header_timeout")

    def _arm_body(self, request: Any) -> None:
        idle = self.gate.cfg.body_idle_s
        self._last_data = self._loop.time()

        def due() -> None:
            self._body_timer = None
            if request.content.is_eof():
                return  # the body is in: what is left is the handler's time, not the peer's
            if self._reading_paused or self._buffer_paused:
                self._last_data = self._loop.time()  # we hold the peer back (a slow store)
            late = self._last_data + idle - self._loop.time()
            if late > 0:
                self._body_timer = self._loop.call_later(late, due)
            else:
                self.gate.leave(self)
                self.drop("body_timeout")
        self._body_timer = self._loop.call_later(idle, due)

    def _cancel_timers(self) -> None:
        for t in (self._head_timer, self._body_timer):
            if t is not None:
                t.cancel()
        self._head_timer = self._body_timer = None


class GatedSite(web.BaseSite):
    """A TCP site whose connections go through a `ConnectionGate`."""

    def __init__(self, runner: web.AppRunner, gate: ConnectionGate, host: str, port: int) -> None:
        super().__init__(runner, backlog=1024)
        self._gate, self._host, self._port = gate, host, port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        # asyncio accepts up to `backlog` sockets in one go before any is admitted (or refused
        # and closed): keep that burst within the descriptors the gate leaves spare, else
        # accept() fails with EMFILE and logs a traceback per try (400 half-heads against 256
        # descriptors: 44,000 lines of log, honest calls held back). The kernel's queue stays
        # `backlog` long (a short one drops connections: a second's SYN retry each).
        burst = max(16, min(self._backlog, self._gate.spare_fds - 32))
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        cfg = self._gate.cfg

        def factory() -> GatedHandler:
            return GatedHandler(self._gate, server, loop=loop, keepalive_timeout=cfg.keepalive_s,
                                 access_log=None)
        self._server = await loop.create_server(factory, self._host, self._port,
                                                backlog=burst, reuse_address=True)
        if burst < self._backlog:
            for listening in self._server.sockets:
                with listening.dup() as sock:  # the same socket: listen() again resizes its queue
                    sock.listen(self._backlog)
