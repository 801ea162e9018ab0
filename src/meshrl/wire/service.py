# over 400 lines: the one HTTP stack every service uses: routes, middleware, guards and the typed
#  answer, kept in one place so no service differs
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
strings valid UTF-8), so nothing is stored that could not be served back. A body cut short is
`400 body_incomplete` and one log line, never a traceback. `/openapi.json` is serialised once,
served with an ETag, and read at most `docs_per_minute` times a minute per IP.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ValidationError

from meshrl.durable import atomic_write
from meshrl.log import get_logger, log_event
from meshrl.wire.connections import ConnectionGate, GatedSite
from meshrl.wire.errors import ErrorBody, ErrorCode, WireError
from meshrl.wire.guard import RateLimiter, RequestGuard, VerifiedRequest
from meshrl.wire.models import ServiceIdentity
from meshrl.wire.values import load_json, valid_text

__all__ = ["Call", "ConnectionGate", "Route", "build_app", "error_response", "listen",
           "load_json", "openapi_document", "route_refusals", "serve_forever"]


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


log = get_logger("meshrl.wire")

# what reading a body raises when the peer cut it: refused, not a server error's traceback
_CUT = (ConnectionResetError, ClientPayloadError, HttpProcessingError, asyncio.IncompleteReadError)

METRICS_KEY = web.AppKey("metrics_registry", CollectorRegistry)
GUARD_KEY = web.AppKey("request_guard", RequestGuard)
GATE_KEY = web.AppKey("connection_gate", ConnectionGate)


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
    content = request.content
    if content.is_eof():  # all of it is here already (the usual small body): no timer
        body = await content.read(limit + 1)  # every buffered piece, up to limit + 1
        if len(body) > limit:
            raise WireError(ErrorCode.BODY_TOO_LARGE, f"more than {limit} bytes")
        return body
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
        if not valid_text(name) or not valid_text(value):
            raise WireError(ErrorCode.NO_SUCH_ROUTE, "the path is not valid UTF-8")
    query = None
    if route.query:
        items = dict(request.query)
        if not all(valid_text(k) and valid_text(v) for k, v in items.items()):
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
            except (*_CUT, RuntimeError) as e:  # one line: cut bodies cannot fill the log
                if isinstance(e, RuntimeError) and request.transport is not None:
                    raise  # not a closed connection ("Connection closed." on a read)
                log_event(log, "request body cut", service=service, route=route.path,
                          peer=request.remote or "", error=f"{type(e).__name__}: {e}"[:200])
                resp = error_response(WireError(ErrorCode.BODY_INCOMPLETE).body(), 400)
            metrics.latency.labels(service, route.path).observe(time.perf_counter() - t0)
            metrics.requests.labels(service, route.path, str(resp.status)).inc()
            return resp
        return handle

    for route in routes:
        app.router.add_route(route.method, route.path, wrap(route))
    # serialised once, not per read; unsigned, so a rate per IP bounds what a flood costs
    doc = json.dumps(openapi_document(service, routes, version)).encode()
    etag = '"' + hashlib.sha256(doc).hexdigest()[:32] + '"'
    readers = RateLimiter(guard.cfg.docs_per_minute, min(10, guard.cfg.docs_per_minute),
                          guard.cfg.state_ttl_s)

    async def openapi(request: web.Request) -> web.Response:
        if not readers.allow(request.remote or "", time.monotonic()):
            per = guard.cfg.docs_per_minute
            return error_response(WireError(ErrorCode.IP_RATE_LIMITED,
                                            f"{per} reads per minute").body(), 429)
        headers = {"ETag": etag, "Cache-Control": "max-age=300"}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=doc, content_type="application/json", headers=headers)

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


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` on host:port (0: any free port); the runner (to clean up) and the base URL.
    An app of `build_app` is served through its `ConnectionGate` (the guard's limits)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    gate = app.get(GATE_KEY)
    site: web.BaseSite = (web.TCPSite(runner, host, port) if gate is None
                          else GatedSite(runner, gate, host, port))
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
    import signal

    from meshrl.config import CommandError

    async def main() -> None:
        # Ctrl-C through the loop's own handler: its wakeup fd wakes the loop whichever thread
        # the signal reaches. Under the default one (a flag the main thread reads when it next
        # runs Python), a signal taken by a worker thread while the loop slept in epoll with no
        # timer due went unseen: a relay in the full test suite ignored Ctrl-C for over 60 s.
        # SIGTERM (a supervisor's stop) the same way: the service stops cleanly (its held
        # requests answered, its database closed) instead of dying mid-write
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        service = make()
        await service.start()
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second one interrupts the stop
                loop.remove_signal_handler(sig)
            await service.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    except errors as e:
        raise CommandError(str(e)) from e
    return 0
