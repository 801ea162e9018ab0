"""The one rules client against a real HTTP server on loopback that answers garbage, values out
of the rules' bounds, errors, or nothing at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from eth_account import Account

from meshrl.pool import PoolRules, PoolRulesError, read_rules
from meshrl.wire import SignedClient


@contextlib.asynccontextmanager
async def serving(handler) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_get("/rules", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _read(handler, stop_after: float | None = None) -> PoolRules | None:  # type: ignore[no-untyped-def]
    async def go() -> PoolRules | None:
        stop = asyncio.Event()
        if stop_after is not None:
            asyncio.get_running_loop().call_later(stop_after, stop.set)
        async with serving(handler) as url, SignedClient(url, Account.create().key) as c:
            return await read_rules(c, stop, poll_s=0.05)
    return asyncio.run(go())


def _answer(body: bytes | str, status: int = 200):  # type: ignore[no-untyped-def]
    async def handler(_: web.Request) -> web.Response:
        data = body.encode() if isinstance(body, str) else body
        return web.Response(body=data, status=status, content_type="application/json")
    return handler


def test_valid_rules_are_read():
    rules = PoolRules(pool_id=3, seed=9)
    assert _read(_answer(rules.model_dump_json())) == rules


@pytest.mark.parametrize(("body", "why"), [
    (b"\xff\xfe not json", "not valid rules"),
    ("[1, 2, 3]", "not valid rules"),
    ('{"pool_id": "three"}', "not valid rules"),
    ('{"pool_id": 1, "sampling": {"temperature": 1e308}}', "not valid rules"),
    ('{"pool_id": 1, "group_size": 99999999999}', "not valid rules"),
    ('{"pool_id": 1, "extra_rule": 1}', "not valid rules"),
])
def test_garbage_or_out_of_bounds_rules_are_a_refusal_not_a_crash(body, why):
    with pytest.raises(PoolRulesError, match=why):
        _read(_answer(body))


def test_a_client_error_is_a_refusal_and_a_server_error_is_waited_out():
    with pytest.raises(PoolRulesError, match="cannot read the pool's rules"):
        _read(_answer('{"error": "no", "code": "not_a_reader"}', status=403))
    answers = iter([(503, "{}"), (503, "{}"), (200, PoolRules(pool_id=2).model_dump_json())])

    async def flaky(_: web.Request) -> web.Response:
        status, body = next(answers)
        return web.Response(text=body, status=status, content_type="application/json")
    assert _read(flaky).pool_id == 2  # type: ignore[union-attr]


def test_an_orchestrator_that_keeps_failing_is_waited_for_until_stopped():
    assert _read(_answer("{}", status=503), stop_after=0.3) is None
