"""Refusal codes: one client class per code, each documented, and every code of the signed
request and the HTTP layer reaching a real client as its class over loopback (the services'
own codes are exercised the same way in tests/orchestrator and tests/discovery)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import BaseModel, Field

import meshrl.wire
from meshrl.wire import (
    Call,
    ErrorCode,
    GuardConfig,
    RequestGuard,
    Route,
    SignedClient,
    SqliteNonceStore,
    WireHTTPError,
    build_app,
    raise_for,
    refusal,
    sign_request,
)
from meshrl.wire.errors import refusal_classes

KEY, OTHER = "0x" + "42" * 32, "0x" + "43" * 32
DOCS = Path(__file__).resolve().parents[2] / "docs" / "wire.md"


class Echo(BaseModel):
    text: str = Field(max_length=100)


class Query(BaseModel):
    k: int = Field(ge=0)


async def echo(call: Call) -> Echo:
    return Echo(text=call.body.text)


async def blob(call: Call) -> Echo:
    await call.request.content.read()
    return Echo(text="stored")


async def teapot(call: Call) -> Echo:
    raise web.HTTPMisdirectedRequest()  # a refusal of aiohttp's own that has no code of ours


ROUTES = [
    Route("POST", "/echo", echo, body=Echo, query=Query, response=Echo, max_body=200),
    Route("PUT", "/blob", blob, response=Echo, stream=True, max_body=1 << 16),
    Route("GET", "/teapot", teapot, response=Echo, signed=False),
]


def test_every_code_has_one_class_exported_from_the_package() -> None:
    classes = refusal_classes()
    assert set(classes) == set(ErrorCode)
    for code, cls in classes.items():
        assert cls.CODE is code and issubclass(cls, WireHTTPError)
        assert getattr(meshrl.wire, cls.__name__) is cls
        assert 400 <= code.status < 600 and code.reason
    assert len({c.__name__ for c in classes.values()}) == len(classes)


def test_a_class_is_chosen_by_code_and_an_unknown_code_is_its_statuss_family() -> None:
    e = refusal(409, "stale_work", "step 3", "stale work")
    assert type(e) is meshrl.wire.StaleWork and e.code is ErrorCode.STALE_WORK
    assert (e.status, e.detail, e.reason) == (409, "step 3", "stale work")
    unknown = refusal(409, "a_code_from_a_newer_server", "d", "r")
    assert type(unknown) is meshrl.wire.Refused and unknown.code == "a_code_from_a_newer_server"
    with pytest.raises(WireHTTPError) as got:
        raise_for(502, b"<html>bad gateway</html>")  # not a service's answer (a proxy)
    assert type(got.value) is meshrl.wire.Transient and got.value.code == ""


def test_docs_list_every_code_with_its_status_and_class() -> None:
    section = DOCS.read_text().split("## Refusals and their codes")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| ([^|]+) \| `(\w+)` \|", section, re.M)
    documented = {code: (status.strip(), cls) for code, status, cls in rows}
    assert len(rows) == len(documented) and set(documented) == {c.value for c in ErrorCode}
    classes = refusal_classes()
    for c in ErrorCode:
        status, cls = documented[c.value]
        assert cls == classes[c].__name__, c
        if c is not ErrorCode.HTTP_REFUSED:  # its status is the refusal's own
            assert status == str(c.status), c


# ---- every code of the signed request and the HTTP layer, over HTTP
def _signed(method: str, path: str, body: bytes, key: str = KEY, **kw: Any) -> dict[str, str]:
    return sign_request(key, method, path, body, **kw).as_dict()


def _with(headers: dict[str, str], **changes: str) -> dict[str, str]:
    return {**headers, **{k.replace("_", "-"): v for k, v in changes.items()}}


BODY = b'{"text": "hi"}'
ECHO = "/echo?k=1"
Request = tuple[str, str, bytes, dict[str, str]]


def _cases() -> dict[ErrorCode, Callable[[], Request | list[Request]]]:
    h = lambda: _signed("POST", ECHO, BODY)  # noqa: E731 - a fresh signature per call
    old, ahead = int(time.time()) - 400, int(time.time()) + 400
    sig = _signed("POST", ECHO, BODY)
    E = ErrorCode
    return {
        E.BODY_TOO_LARGE: lambda: ("POST", ECHO, b"x" * 300, _signed("POST", ECHO, b"x" * 300)),
        E.BODY_SHA256_MISMATCH: lambda: ("POST", ECHO, b'{"text": "ho"}', h()),
        E.MISSING_SIGNATURE: lambda: ("POST", ECHO, BODY, {}),
        E.MALFORMED_ADDRESS: lambda: ("POST", ECHO, BODY, _with(h(), x_address="0xzz")),
        E.MALFORMED_NONCE: lambda: ("POST", ECHO, BODY, _with(h(), x_nonce="!!")),
        E.MALFORMED_TIMESTAMP: lambda: ("POST", ECHO, BODY, _with(h(), x_timestamp="soon")),
        # only a streamed body reaches the header checks with its declared hash unread
        E.MALFORMED_BODY_SHA256: lambda: ("PUT", "/blob", b"x", _with(
            _signed("PUT", "/blob", b"x"), x_content_sha256="zz")),
        E.STALE_TIMESTAMP: lambda: ("POST", ECHO, BODY, _signed("POST", ECHO, BODY,
                                                                timestamp=old)),
        E.FUTURE_TIMESTAMP: lambda: ("POST", ECHO, BODY, _signed("POST", ECHO, BODY,
                                                                 timestamp=ahead)),
        E.BAD_SIGNATURE: lambda: ("POST", ECHO, BODY, _with(h(), x_signature="0xnothex")),
        E.WRONG_SIGNER: lambda: ("POST", ECHO, BODY, _with(
            _signed("POST", ECHO, BODY, key=OTHER), x_address=sig["x-address"])),
        E.RATE_LIMITED: lambda: [("POST", ECHO, BODY, h()) for _ in range(2)],  # burst of 1
        E.REPLAYED_NONCE: lambda: [("POST", ECHO, BODY, sig), ("POST", ECHO, BODY, sig)],
        E.NONCE_STORE_UNAVAILABLE: lambda: ("POST", ECHO, BODY, h()),
        E.MALFORMED_JSON: lambda: ("POST", ECHO, b"{no", _signed("POST", ECHO, b"{no")),
        E.INVALID_BODY: lambda: ("POST", ECHO, b"{}", _signed("POST", ECHO, b"{}")),
        E.INVALID_QUERY: lambda: ("POST", "/echo?k=-1", BODY, _signed("POST", "/echo?k=-1",
                                                                      BODY)),
        E.NO_SUCH_ROUTE: lambda: ("GET", "/nope", b"", {}),
        E.METHOD_NOT_ALLOWED: lambda: ("DELETE", "/echo", b"", {}),
        E.HTTP_REFUSED: lambda: ("GET", "/teapot", b"", {}),
    }


CASES = _cases()  # its keys parametrize the test; each test builds its requests afresh


def serve(test: Callable[[str], Awaitable[Any]], guard: RequestGuard) -> Any:
    async def main() -> Any:
        runner = web.AppRunner(build_app("test", ROUTES, guard))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            return await test(f"http://127.0.0.1:{runner.addresses[0][1]}")
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def _guard(code: ErrorCode, tmp: Path) -> RequestGuard:
    if code is ErrorCode.RATE_LIMITED:
        return RequestGuard(GuardConfig(rate_per_minute=1, rate_burst=1))
    if code is ErrorCode.NONCE_STORE_UNAVAILABLE:
        db = sqlite3.connect(tmp / "nonces.db", isolation_level=None)
        guard = RequestGuard(GuardConfig(), nonces=SqliteNonceStore(db))
        db.close()  # the store can no longer write: nothing may be served
        return guard
    return RequestGuard(GuardConfig())


async def _send(url: str, req: Request) -> None:
    """One raw request (headers as crafted); its answer parsed by the client's own code."""
    method, path, body, headers = req
    async with aiohttp.ClientSession() as s, s.request(method, url + path, data=body,
                                                       headers=headers) as r:
        raise_for(r.status, await r.read())


@pytest.mark.parametrize("code", list(CASES), ids=lambda c: c.value)
def test_each_code_reaches_the_client_as_its_class(code: ErrorCode, tmp_path: Path) -> None:
    reqs = _cases()[code]()  # timestamps of now: a test run late in a long session still sees
    # a future timestamp as future and a first use of a nonce as fresh
    *first, last = reqs if isinstance(reqs, list) else [reqs]

    async def t(url: str) -> tuple[WireHTTPError, dict[str, Any]]:
        for req in first:  # what the refusal needs before it (the nonce's first use, ...)
            await _send(url, req)
        with pytest.raises(WireHTTPError) as got:
            await _send(url, last)
        async with aiohttp.ClientSession() as s, s.get(url + "/openapi.json") as r:
            return got.value, await r.json()
    err, doc = serve(t, _guard(code, tmp_path))
    assert type(err) is refusal_classes()[code], err
    assert err.code is code and err.reason
    assert err.status == (421 if code is ErrorCode.HTTP_REFUSED else code.status)
    method, path = last[0].lower(), last[1].split("?")[0]
    if path in ("/echo", "/blob") and method in doc["paths"][path]:
        # a route's refusal is declared among its OpenAPI error responses
        responses = doc["paths"][path][method]["responses"].values()
        declared = {c for r in responses if "allOf" in r["content"]["application/json"]["schema"]
                    for c in r["content"]["application/json"]["schema"]["allOf"][1]
                    ["properties"]["code"]["enum"]}
        assert code.value in declared


def test_the_client_helper_raises_the_class_too() -> None:
    """SignedClient itself (not only `raise_for` on a raw answer) raises by code."""
    async def t(url: str) -> None:
        async with SignedClient(url, KEY) as c:
            with pytest.raises(meshrl.wire.InvalidQuery):
                await c.call("POST", "/echo", Echo(text="a"), query={"k": -1})
            with pytest.raises(meshrl.wire.NoSuchRoute):
                await c.get_bytes("/nope")
    serve(t, RequestGuard(GuardConfig()))
