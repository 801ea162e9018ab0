"""One HTTP stack for every service: aiohttp routes declared with pydantic models.

A service lists `Route`s; `build_app` turns them into an aiohttp application whose middleware
verifies every signed route (`RequestGuard`), parses the JSON body and query into the route's
models, serialises the response model, counts requests in Prometheus metrics and answers every
refusal as `{"error": reason, "code": code, "detail": ...}` (`ErrorBody`) with the code's status.
The OpenAPI document is built from the same routes (`openapi_document`), each route's refusals
included, and served at `/openapi.json`; `/health`, `/metrics` and `/identity` (the audience a
request must be signed for) are unsigned.

Everything a peer sends is bounded before it costs much (`listen`): connections per source IP
and in all (the least recently active idle one makes way, else the new one is dropped), the
time to send a request's head and body, and every JSON value (numbers finite and within 64 bits,
strings valid UTF-8), so nothing is stored that could not be served back.
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ValidationError

from meshrl.durable import atomic_write
from meshrl.wire.errors import ErrorBody, ErrorCode, WireError
from meshrl.wire.guard import GuardConfig, RequestGuard, VerifiedRequest
from meshrl.wire.models import ServiceIdentity

__all__ = ["Call", "ConnectionGate", "Route", "build_app", "error_response", "listen",
           "openapi_document", "route_refusals", "serve_forever"]


@dataclass
class Call:
    """What a handler gets: the raw request, its verified signer, and the parsed models."""

    request: web.Request
    signer: VerifiedRequest | None
    body: Any = None
    query: Any = None

    @property
    def address(self) -> str:
        if self.signer is None:
            raise WireError(ErrorCode.MISSING_SIGNATURE)
        return self.signer.address

    def param(self, name: str) -> str:
        return self.request.match_info[name]


Handler = Callable[[Call], Awaitable[BaseModel | web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One endpoint. `stream` routes are not read by the middleware: the handler reads
    `call.request.content` itself and must check the bytes against `call.signer.body_sha256`.
    `refusals` are the codes the handler itself may answer (the signature's, the body's and the
    query's are added from the route's shape: `route_refusals`)."""

    method: str
    path: str
    handler: Handler
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    signed: bool = True
    max_body: int | None = None
    stream: bool = False
    summary: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    refusals: tuple[ErrorCode, ...] = ()


_SIGNED = (ErrorCode.MISSING_SIGNATURE, ErrorCode.WRONG_AUDIENCE, ErrorCode.MALFORMED_ADDRESS,
           ErrorCode.MALFORMED_NONCE, ErrorCode.MALFORMED_TIMESTAMP,
           ErrorCode.MALFORMED_BODY_SHA256, ErrorCode.STALE_TIMESTAMP,
           ErrorCode.FUTURE_TIMESTAMP, ErrorCode.IP_RATE_LIMITED, ErrorCode.BAD_SIGNATURE,
           ErrorCode.WRONG_SIGNER, ErrorCode.RATE_LIMITED, ErrorCode.REPLAYED_NONCE,
           ErrorCode.NONCE_STORE_UNAVAILABLE)


def route_refusals(route: Route) -> tuple[ErrorCode, ...]:
    """Every code `route` may answer: its shape's (size, signature, body, query), then its own."""
    out = [ErrorCode.BODY_TOO_LARGE]
    if route.signed or route.stream:
        out += [*([] if route.stream else [ErrorCode.BODY_SHA256_MISMATCH]), *_SIGNED]
    if route.body is not None:
        out += [ErrorCode.REQUEST_TIMEOUT, ErrorCode.MALFORMED_JSON, ErrorCode.INVALID_BODY]
    if route.query is not None:
        out.append(ErrorCode.INVALID_QUERY)
    return tuple(dict.fromkeys([*out, *route.refusals]))


METRICS_KEY = web.AppKey("metrics_registry", CollectorRegistry)
GUARD_KEY = web.AppKey("request_guard", RequestGuard)
GATE_KEY = web.AppKey("connection_gate", "ConnectionGate")


def error_response(body: ErrorBody, status: int) -> web.Response:
    return web.Response(body=body.model_dump_json().encode(), status=status,
                        content_type="application/json")


class _Metrics:
    def __init__(self, service: str, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "meshrl_http_requests", "HTTP requests by route and status",
            ["service", "route", "status"], registry=self.registry)
        self.latency = Histogram(
            "meshrl_http_request_seconds", "HTTP request latency", ["service", "route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
        self.service = service


async def _read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, however many pieces it arrives in, within `limit` bytes and `timeout_s`."""
    if request.content_length is not None and request.content_length > limit:
        raise WireError(ErrorCode.BODY_TOO_LARGE, f"{request.content_length} > {limit} bytes")
    parts, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await request.content.read(limit + 1 - size):
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise WireError(ErrorCode.BODY_TOO_LARGE, f"more than {limit} bytes")
    except TimeoutError:
        raise WireError(ErrorCode.REQUEST_TIMEOUT, f"body not sent within {timeout_s} s") from None
    return b"".join(parts)


_I64 = (-(1 << 63), (1 << 63) - 1)


class _Unservable(ValueError):
    """A JSON value no service could store and serve back."""


def _no_constant(name: str) -> float:
    raise _Unservable(f"{name} is not a number")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e999 parses as inf
        raise _Unservable(f"{text[:20]} is not a finite number")
    return x


def _bounded(text: str) -> int:
    if len(text) > 20:  # wider than 64 bits whatever the digits (and int() of 5000 raises)
        raise _Unservable("an integer outside 64 bits")
    x = int(text)
    if not _I64[0] <= x <= _I64[1]:
        raise _Unservable("an integer outside 64 bits")
    return x


def load_json(raw: bytes) -> Any:
    """A request body as JSON, or `MalformedJson`; then `InvalidBody` for any value a service
    could not store and serve back: a non-finite number, an integer outside 64 bits, a string
    (or key) that is not valid UTF-8 (a lone surrogate)."""
    if not raw:
        return None
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite,
                          parse_int=_bounded)
    except _Unservable as e:
        raise WireError(ErrorCode.INVALID_BODY, str(e)) from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8/16/32, nested too deeply
        raise WireError(ErrorCode.MALFORMED_JSON) from None
    bad = _first_bad_string(data)
    if bad is not None:
        raise WireError(ErrorCode.INVALID_BODY, f"{bad[:200]}: not valid UTF-8 text")
    return data


def _first_bad_string(data: Any) -> str | None:
    """The path of the first string (or key) with a lone surrogate, None if there is none."""
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, str):
            if not _utf8(x):
                return where
        elif isinstance(x, dict):
            for k, v in x.items():
                if not _utf8(k):
                    return where
                stack.append((f"{where}.{k}", v))
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(x))
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse(model: type[BaseModel], data: Any, what: str) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, x['loc'])) or what}: {x['msg']}" for x in e.errors())
        code = ErrorCode.INVALID_BODY if what == "body" else ErrorCode.INVALID_QUERY
        raise WireError(code, msgs[:500]) from None


async def _dispatch(route: Route, guard: RequestGuard, request: web.Request) -> web.StreamResponse:
    signer, body_model = None, None
    peer = request.remote or ""
    if route.stream:
        signer = guard.check_headers(request.method, request.raw_path, request.headers,
                                     request.content_length, route.max_body, peer)
    else:
        limit = route.max_body if route.max_body is not None else guard.cfg.max_body_bytes
        raw = await _read_body(request, limit, guard.cfg.body_timeout_s)
        if route.signed:
            signer = guard.check(request.method, request.raw_path, request.headers, raw, limit,
                                 peer)
        if route.body is not None:
            body_model = _parse(route.body, load_json(raw), "body")
    for name, value in request.match_info.items():
        if not _utf8(name) or not _utf8(value):
            raise WireError(ErrorCode.NO_SUCH_ROUTE, "the path is not valid UTF-8")
    query = None
    if route.query:
        items = dict(request.query)
        if not all(_utf8(k) and _utf8(v) for k, v in items.items()):
            raise WireError(ErrorCode.INVALID_QUERY, "not valid UTF-8 text")
        query = _parse(route.query, items, "query")
    result = await route.handler(Call(request, signer, body_model, query))
    if isinstance(result, web.StreamResponse):
        return result
    return web.Response(body=result.model_dump_json().encode(), content_type="application/json")


_AIOHTTP = {404: ErrorCode.NO_SUCH_ROUTE, 405: ErrorCode.METHOD_NOT_ALLOWED}


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own refusals (no such route, wrong method) answered as JSON too; one it has no
    code for keeps its status as `http_refused`."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = _AIOHTTP.get(e.status, ErrorCode.HTTP_REFUSED)
        reason = e.reason.lower() if code is ErrorCode.HTTP_REFUSED else code.reason
        return error_response(ErrorBody(error=reason, code=code), e.status)


def build_app(
    service: str, routes: list[Route], guard: RequestGuard, version: str = "1",
    registry: CollectorRegistry | None = None, client_max_size: int = 1 << 30,
) -> web.Application:
    """The aiohttp application of `routes` plus `/openapi.json` and `/metrics` (of `registry`,
    a fresh one by default, where the service may register its own metrics too)."""
    metrics = _Metrics(service, registry or CollectorRegistry())
    app = web.Application(client_max_size=client_max_size, middlewares=[_json_errors])
    app[METRICS_KEY] = metrics.registry
    app[GUARD_KEY] = guard
    gate = app[GATE_KEY] = ConnectionGate(guard.cfg)
    state = Gauge("meshrl_guard_entries", "rate, nonce and connection state held, by table",
                  ["service", "table"], registry=metrics.registry)
    for table in guard.sizes():
        state.labels(service, table).set_function(lambda t=table: guard.sizes()[t])
    state.labels(service, "connections").set_function(lambda: gate.total)
    refused = Counter("meshrl_connections_dropped", "connections closed by the gate, by why",
                      ["service", "why"], registry=metrics.registry)
    gate.on_drop = lambda why: refused.labels(service, why).inc()
    identity = ServiceIdentity(service=service, audience=guard.audience)

    def wrap(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            try:
                resp = await _dispatch(route, guard, request)
            except WireError as e:
                resp = error_response(e.body(), e.status)
            metrics.latency.labels(service, route.path).observe(time.perf_counter() - t0)
            metrics.requests.labels(service, route.path, str(resp.status)).inc()
            return resp
        return handle

    for route in routes:
        app.router.add_route(route.method, route.path, wrap(route))
    doc = openapi_document(service, routes, version)

    async def openapi(_: web.Request) -> web.Response:
        return web.json_response(doc)

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry),
                            content_type="text/plain", charset="utf-8")

    async def whoami(_: web.Request) -> web.Response:
        return web.Response(body=identity.model_dump_json().encode(),
                            content_type="application/json")

    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/metrics", prometheus)
    app.router.add_get("/identity", whoami)
    return app


def openapi_document(service: str, routes: list[Route], version: str = "1") -> dict[str, Any]:
    """OpenAPI 3.1 from the routes' pydantic models (schemas under components/schemas). Each
    route's refusals are its error responses, by status, each an `ErrorBody` whose `code` is
    one of that status's codes."""
    schemas: dict[str, Any] = {}

    def ref(model: type[BaseModel]) -> dict[str, str]:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    error = ref(ErrorBody)  # its `code` is the `ErrorCode` schema: every code, an enum
    paths: dict[str, Any] = {}
    for r in routes:
        op: dict[str, Any] = {"summary": r.summary, "tags": list(r.tags),
                              "responses": _refusal_responses(route_refusals(r), error)}
        ok: dict[str, Any] = {"description": "ok"}
        if r.response is not None:
            ok["content"] = {"application/json": {"schema": ref(r.response)}}
        op["responses"]["200"] = ok
        if r.body is not None:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": ref(r.body)}}}
        elif r.stream:
            op["requestBody"] = {"required": True, "content": {"application/octet-stream": {}}}
        params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                  for n in _path_params(r.path)]
        if r.query is not None:
            for name, f in r.query.model_fields.items():
                params.append({"name": name, "in": "query", "required": f.is_required(),
                               "description": f.description or "", "schema": {}})
        if params:
            op["parameters"] = params
        if r.signed:
            op["security"] = [{"eip191": []}]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": f"meshrl {service}", "version": version},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"eip191": {
            "type": "apiKey", "in": "header", "name": "x-signature",
            "description": "EIP-191 signature; see meshrl.wire.signing for the message"}}},
    }


def _refusal_responses(codes: tuple[ErrorCode, ...], error: dict[str, str]) -> dict[str, Any]:
    by_status: dict[int, list[ErrorCode]] = {}
    for c in codes:
        by_status.setdefault(c.status, []).append(c)
    out: dict[str, Any] = {}
    for status, group in sorted(by_status.items()):
        schema = {"allOf": [error, {"properties": {"code": {"enum": [c.value for c in group]}}}]}
        out[str(status)] = {"description": "; ".join(f"{c.value}: {c.reason}" for c in group),
                            "content": {"application/json": {"schema": schema}}}
    return out


def _path_params(path: str) -> list[str]:
    return [part[1:-1].split(":")[0] for part in path.split("/")
            if part.startswith("{") and part.endswith("}")]


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
        self.total = 0
        self._all: dict[_GatedHandler, None] = {}  # least recently active first
        self._unserved: dict[_GatedHandler, None] = {}  # no request yet, oldest first
        self._by_ip: dict[str, dict[_GatedHandler, None]] = {}
        self.on_drop: Callable[[str], None] = lambda why: None

    def admit(self, conn: _GatedHandler) -> bool:
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

    def touch(self, conn: _GatedHandler) -> None:
        """`conn` carries a request: it goes to the back of the eviction order."""
        if conn in self._all:
            self._unserved.pop(conn, None)
            del self._all[conn]
            self._all[conn] = None
            mine = self._by_ip[conn.peer]
            del mine[conn]
            mine[conn] = None

    def leave(self, conn: _GatedHandler) -> None:
        if conn not in self._all:
            return  # left already (evicted, then its transport closed)
        del self._all[conn]
        self._unserved.pop(conn, None)
        self.total -= 1
        mine = self._by_ip[conn.peer]
        del mine[conn]
        if not mine:
            del self._by_ip[conn.peer]

    def _evict(self, first: dict[_GatedHandler, None], then: dict[_GatedHandler, None]) -> bool:
        for pool, unserved_only in ((first, True), (then, False)):
            for victim in pool:
                if not victim.busy and (victim.served == 0 or not unserved_only):
                    self.leave(victim)
                    victim.drop("make_way")
                    return True
        return False


class _GatedHandler(RequestHandler):
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
        headers) is a typed refusal like any other, not text, and not a logged traceback: a peer
        must not be able to fill the logs."""
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        resp = error_response(ErrorBody(error="malformed request", code=ErrorCode.HTTP_REFUSED,
                                        detail=(message or "")[:200]), status)
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


class _GatedSite(web.BaseSite):
    """A TCP site whose connections go through a `ConnectionGate`."""

    def __init__(self, runner: web.AppRunner, gate: ConnectionGate, host: str, port: int) -> None:
        super().__init__(runner, backlog=1024)
        self._gate, self._host, self._port = gate, host, port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        cfg = self._gate.cfg

        def factory() -> _GatedHandler:
            return _GatedHandler(self._gate, server, loop=loop, keepalive_timeout=cfg.keepalive_s,
                                 access_log=None)
        self._server = await loop.create_server(factory, self._host, self._port,
                                                backlog=self._backlog, reuse_address=True)


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0: any free port); the runner (to clean up) and the base URL.
    An app of `build_app` is served through its `ConnectionGate` (the guard's limits)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    gate = app.get(GATE_KEY)
    site: web.BaseSite = (web.TCPSite(runner, host, port) if gate is None
                          else _GatedSite(runner, gate, host, port))
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://{host}:{bound}"


def write_ready_file(path: str, url: str) -> None:
    """Announce `url` in `path` atomically (tests and scripts wait for it); "" writes nothing."""
    if path:
        atomic_write(path, url, sync=False)  # read while this machine is up, never after


def serve_forever(make: Callable[[], Any], errors: tuple[type[Exception], ...] = ()) -> int:
    """A role's command: build the service (`make()`, an object with async `start`/`stop`) in
    the event loop, serve until Ctrl-C, stop it. An error in `errors` (no deployment, an
    unreachable chain) ends as one line (`CommandError`), not a traceback."""
    import asyncio
    import contextlib

    from meshrl.config import CommandError

    async def main() -> None:
        service = make()
        await service.start()
        try:
            await asyncio.Event().wait()
        finally:
            await service.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    except errors as e:
        raise CommandError(str(e)) from e
    return 0
