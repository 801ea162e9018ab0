"""The service scaffolding on a real loopback server: signed calls, refusals as JSON 4xx,
streamed bodies, OpenAPI and metrics."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, Field

from meshrl.wire import (
    BodySha256Mismatch,
    BodyTooLarge,
    Call,
    ErrorCode,
    GuardConfig,
    InvalidBody,
    InvalidQuery,
    RequestGuard,
    Route,
    SignedClient,
    WireError,
    WireHTTPError,
    WireUnavailable,
    build_app,
    sign_request,
)

KEY = "0x" + "42" * 32


class Echo(BaseModel):
    text: str = Field(max_length=100)
    n: int = 0


class Query(BaseModel):
    k: int = Field(ge=0)


class Stored(BaseModel):
    address: str
    size: int


async def echo(call: Call) -> Echo:
    return Echo(text=call.body.text + "!", n=call.body.n + call.query.k)


async def store(call: Call) -> Stored:
    h, size = hashlib.sha256(), 0
    async for chunk in call.request.content.iter_chunked(1 << 16):
        h.update(chunk)
        size += len(chunk)
    if h.hexdigest() != call.signer.body_sha256:
        raise WireError(ErrorCode.BODY_SHA256_MISMATCH)
    return Stored(address=call.address, size=size)


ROUTES = [
    Route("POST", "/echo", echo, body=Echo, query=Query, response=Echo, max_body=200),
    Route("PUT", "/blob/{name}", store, response=Stored, stream=True, max_body=1 << 22,
          refusals=(ErrorCode.BODY_SHA256_MISMATCH,)),
]


def serve(test: Callable[[str], Awaitable[Any]], **guard: int) -> Any:
    async def main() -> Any:
        app = build_app("test", ROUTES, RequestGuard(GuardConfig(**guard)))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await test(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()
    return asyncio.run(main())


async def raw(url: str, method: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, url + path, data=body,
                                                       headers=headers) as r:
        return r.status, await r.json()


def test_signed_call_and_refusals() -> None:
    async def t(url: str) -> None:
        async with SignedClient(url, KEY) as c:
            out = await c.call("POST", "/echo", Echo(text="hi", n=1), response=Echo,
                               query={"k": 2})
            assert out == Echo(text="hi!", n=3)
            for body, query, status, refusal in [
                ({"text": "x" * 101}, {"k": 0}, 422, InvalidBody),
                ({"text": "x"}, {"k": -1}, 422, InvalidQuery),
                ({"text": "x" * 300}, {"k": 0}, 413, BodyTooLarge),
            ]:
                try:
                    await c.call("POST", "/echo", body, query=query)
                    raise AssertionError("not refused")
                except WireHTTPError as e:
                    assert type(e) is refusal and e.status == status and e.code == refusal.CODE
        body = b"{not json"
        h = sign_request(KEY, "POST", "/echo?k=1", body).as_dict()
        assert (await raw(url, "POST", "/echo?k=1", body, h)) == (
            400, {"error": "malformed json", "code": "malformed_json", "detail": ""})
        body = b'{"text": "a"}'
        h = sign_request(KEY, "POST", "/echo?k=1", body).as_dict()
        assert (await raw(url, "POST", "/echo?k=1", body, h))[0] == 200
        assert (await raw(url, "POST", "/echo?k=1", body, h)) == (
            409, {"error": "replayed nonce", "code": "replayed_nonce", "detail": ""})
        assert (await raw(url, "POST", "/echo?k=1", body, {}))[1]["code"] == "missing_signature"
    serve(t)


def test_streamed_upload_checks_its_hash(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    f = tmp_path / "blob"
    f.write_bytes(data)

    async def t(url: str) -> None:
        async with SignedClient(url, KEY) as c:
            sha = hashlib.sha256(data).hexdigest()
            out = await c.upload("PUT", "/blob/a", f, sha)
            assert out == {"address": c.address, "size": len(data)}
            try:
                await c.upload("PUT", "/blob/b", f, "0" * 64)
                raise AssertionError("not refused")
            except BodySha256Mismatch as e:
                assert (e.status, e.reason) == (400, "body sha256 mismatch")
    serve(t)


def test_unreachable_service_is_one_transient_oserror(tmp_path: Path) -> None:
    """Refused, dropped and timed-out connections all arrive as `WireUnavailable`, an OSError,
    so a role that retries on `OSError` rides out a restarting service."""
    async def dropper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()  # the connection is dropped with no answer (a dying server)

    async def main() -> list[BaseException]:
        server = await asyncio.start_server(dropper, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            with socket.socket() as probe:  # a port that was free a moment ago: refused
                probe.bind(("127.0.0.1", 0))
                closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
            out = []
            for url in (closed, f"http://127.0.0.1:{port}"):
                async with SignedClient(url, KEY, timeout_s=5) as c:
                    for attempt in (c.call("POST", "/echo", Echo(text="x")),
                                    c.get_bytes("/blob/a")):
                        try:
                            await attempt
                        except WireUnavailable as e:
                            out.append(e)
            return out
    errors = asyncio.run(main())
    assert len(errors) == 4
    assert all(isinstance(e, OSError) and "unreachable" in str(e) for e in errors)


def test_flood_is_429_while_others_are_served() -> None:
    async def t(url: str) -> None:
        async with SignedClient(url, KEY) as a, SignedClient(url, "0x" + "43" * 32) as b:
            codes = []
            for _ in range(8):
                try:
                    await a.call("POST", "/echo", {"text": "x"}, query={"k": 0})
                    codes.append(200)
                except WireHTTPError as e:
                    codes.append(e.status)
            assert codes == [200] * 5 + [429] * 3
            assert (await b.call("POST", "/echo", {"text": "y"}, query={"k": 0}))["text"] == "y!"
    serve(t, rate_per_minute=5, rate_burst=5)


def test_openapi_and_metrics() -> None:
    async def t(url: str) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/openapi.json") as r:
                doc = await r.json()
            async with SignedClient(url, KEY, session=s) as c:
                await c.call("POST", "/echo", {"text": "x"}, query={"k": 0})
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
        assert doc["openapi"] == "3.1.0"
        op = doc["paths"]["/echo"]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"] == \
            "#/components/schemas/Echo"
        assert doc["components"]["schemas"]["Echo"]["properties"]["text"]["maxLength"] == 100
        assert [p["name"] for p in doc["paths"]["/blob/{name}"]["put"]["parameters"]] == ["name"]
        # refusals: the error body's code is the enum of every code; each route lists its own
        codes = doc["components"]["schemas"]["ErrorCode"]["enum"]
        assert codes == [c.value for c in ErrorCode]
        assert doc["components"]["schemas"]["ErrorBody"]["properties"]["code"] == {
            "$ref": "#/components/schemas/ErrorCode"}
        r422 = op["responses"]["422"]["content"]["application/json"]["schema"]["allOf"]
        assert r422 == [{"$ref": "#/components/schemas/ErrorBody"},
                        {"properties": {"code": {"enum": ["invalid_body", "invalid_query"]}}}]
        blob = doc["paths"]["/blob/{name}"]["put"]["responses"]
        assert "body_sha256_mismatch" in blob["400"]["description"]
        assert 'meshrl_http_requests_total{route="/echo",service="test",status="200"} 1.0' \
            in metrics
    serve(t)


def test_unknown_route_and_method_are_json_4xx() -> None:
    async def t(url: str) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/nope") as r:
                assert (r.status, await r.json()) == (
                    404, {"error": "no such route", "code": "no_such_route", "detail": ""})
            async with s.delete(url + "/echo") as r:
                assert r.status == 405 and (await r.json())["code"] == "method_not_allowed"
    serve(t)
