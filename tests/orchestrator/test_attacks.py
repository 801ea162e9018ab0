"""Attacks on the orchestrator, each refused with its code (raised as its class) and with no
state changed: the ledger, the node table (by /health) and the file store are compared before
and after."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from meshrl.wire import (
    ErrorCode,
    SignedClient,
    SignedHeaders,
    WireHTTPError,
    raise_for,
    sign_request,
)
from meshrl.wire.models import Heartbeat, LedgerPage, SlotRequest, UploadSlot, Verdict

from .conftest import Pool, next_counter, parquet_framed
from .net import run

pytestmark = pytest.mark.anvil


async def snapshot(pool: Pool) -> tuple[Any, ...]:
    async with aiohttp.ClientSession() as s, s.get(pool.orch.url + "/health") as r:
        health = (await r.json())["info"]
    async with SignedClient(pool.orch.url, pool.key("trainer")) as t:
        ledger = await t.call("GET", "/ledger", response=LedgerPage)
    files = sorted(p.name for p in (pool.tmp / "files").rglob("*") if p.is_file())
    health.pop("chain_block")
    health.pop("signatures")
    return health, [(e.sha256, e.status) for e in ledger.entries], files


def refused(pool: Pool, attack: Callable[[], Awaitable[Any]],
            code: ErrorCode | set[ErrorCode]) -> None:
    """`attack` must be refused with `code` (one of them) and change nothing observable."""
    codes = {code} if isinstance(code, ErrorCode) else code

    async def t() -> None:
        before = await snapshot(pool)
        with pytest.raises(WireHTTPError) as e:
            await attack()
        assert e.value.code in codes and type(e.value).CODE is e.value.code, e.value
        assert e.value.status == e.value.code.status  # type: ignore[attr-defined]
        assert await snapshot(pool) == before
    run(t())


async def send(url: str, method: str, path: str, body: bytes, headers: dict) -> Any:
    """A raw request; a non-2xx answer raises its refusal as the client helper does."""
    target = URL(url + path, encoded=True)  # as written: no client-side normalisation
    async with aiohttp.ClientSession() as s, s.request(method, target, data=body,
                                                       headers=headers) as r:
        data = await r.read()
        raise_for(r.status, data)
        return json.loads(data)


HB = Heartbeat().model_dump_json().encode()


@functools.cache
def audience(url: str) -> str:
    """The audience this service's requests are signed for (`GET /identity`)."""
    with urllib.request.urlopen(url + "/identity", timeout=30) as r:
        return str(json.load(r)["audience"])


def signed(pool: Pool, key: str, method: str, path: str, body: bytes = b"",
           **kw: Any) -> SignedHeaders:
    """A raw request's headers, signed for the pool's orchestrator."""
    return sign_request(key, method, path, body, audience=audience(pool.orch.url), **kw)


def test_replayed_request(pool: Pool) -> None:
    h = signed(pool, pool.key("n1"), "POST", "/heartbeat", HB).as_dict()
    run(send(pool.orch.url, "POST", "/heartbeat", HB, h))
    refused(pool, lambda: send(pool.orch.url, "POST", "/heartbeat", HB, h),
            ErrorCode.REPLAYED_NONCE)


@pytest.mark.parametrize("offset, code", [(-400, ErrorCode.STALE_TIMESTAMP),
                                          (400, ErrorCode.FUTURE_TIMESTAMP)])
def test_stale_and_future_timestamps(pool: Pool, offset: int, code: ErrorCode) -> None:
    h = signed(pool, pool.key("n1"), "POST", "/heartbeat", HB,
                     timestamp=int(time.time()) + offset).as_dict()
    refused(pool, lambda: send(pool.orch.url, "POST", "/heartbeat", HB, h), code)


def test_forged_signature(pool: Pool) -> None:
    h = signed(pool, pool.key("n1"), "POST", "/heartbeat", HB).as_dict()
    sig = bytearray.fromhex(h["x-signature"][2:])
    sig[10] ^= 0x55
    h["x-signature"] = "0x" + sig.hex()
    # a changed r either recovers no key or someone else's
    refused(pool, lambda: send(pool.orch.url, "POST", "/heartbeat", HB, h),
            {ErrorCode.BAD_SIGNATURE, ErrorCode.WRONG_SIGNER})


def test_valid_signature_of_another_address(pool: Pool) -> None:
    h = signed(pool, pool.key("stranger"), "POST", "/heartbeat", HB).as_dict()
    h["x-address"] = pool.chain.accounts["n1"].address
    refused(pool, lambda: send(pool.orch.url, "POST", "/heartbeat", HB, h),
            ErrorCode.WRONG_SIGNER)


def test_oversized_body(pool: Pool) -> None:
    body = b'{"policy_version": 0, "pad": "' + b"x" * (20 << 10) + b'"}'
    h = signed(pool, pool.key("n1"), "POST", "/heartbeat", body).as_dict()
    refused(pool, lambda: send(pool.orch.url, "POST", "/heartbeat", body, h),
            ErrorCode.BODY_TOO_LARGE)


async def grant(pool: Pool, node: str, data: bytes) -> UploadSlot:
    async with SignedClient(pool.orch.url, pool.key(node)) as c:
        req = SlotRequest(sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                          policy_version=3, work_units=10, counter=next_counter())
        return await c.call("POST", "/uploads", req, response=UploadSlot)


def _file(pool: Pool, name: str, data: bytes) -> Path:
    path = pool.tmp / name
    path.write_bytes(data)
    return path


def test_upload_whose_bytes_do_not_match(pool: Pool) -> None:
    good = parquet_framed(b"rollout-a" * 1000)
    slot = run(grant(pool, "n1", good))
    bad = _file(pool, "bad", parquet_framed(b"rollout-b" * 1000))  # same size, other bytes
    sha_good = hashlib.sha256(good).hexdigest()

    async def lie() -> Any:  # signs the granted sha256 but sends other bytes
        async with SignedClient(pool.orch.url, pool.key("n1")) as c:
            return await c.upload("PUT", slot.url, bad, sha_good)

    async def honest_other() -> Any:  # signs what it sends, which is not the granted file
        async with SignedClient(pool.orch.url, pool.key("n1")) as c:
            return await c.upload("PUT", slot.url, bad, hashlib.sha256(bad.read_bytes())
                                  .hexdigest())
    refused(pool, lie, ErrorCode.SHA256_MISMATCH)
    refused(pool, honest_other, ErrorCode.SHA256_MISMATCH)

    async def then_honest() -> Any:  # the slot is still usable by its node with the right file
        async with SignedClient(pool.orch.url, pool.key("n1")) as c:
            return await c.upload("PUT", slot.url, _file(pool, "good", good), sha_good)
    assert run(then_honest())["status"] == "uploaded"


def test_upload_without_slot_into_other_nodes_slot_and_twice(pool: Pool) -> None:
    data = parquet_framed(b"rollout-c" * 1000)
    path, sha = _file(pool, "c", data), hashlib.sha256(data).hexdigest()

    def up(node: str, url: str) -> Callable[[], Awaitable[Any]]:
        async def go() -> Any:
            async with SignedClient(pool.orch.url, pool.key(node)) as c:
                return await c.upload("PUT", url, path, sha)
        return go
    refused(pool, up("n1", "/uploads/" + "ab" * 16), ErrorCode.NO_SUCH_SLOT)
    slot = run(grant(pool, "n1", data))
    refused(pool, up("n2", slot.url), ErrorCode.SLOT_OF_ANOTHER_NODE)
    assert run(up("n1", slot.url)())["status"] == "uploaded"
    refused(pool, up("n1", slot.url), ErrorCode.SLOT_ALREADY_USED)


def test_concurrent_uses_of_one_slot_store_once(pool: Pool) -> None:
    data = parquet_framed(b"rollout-d" * 100_000)
    path, sha = _file(pool, "d", data), hashlib.sha256(data).hexdigest()
    slot = run(grant(pool, "n1", data))

    async def race() -> list[Any]:
        async with SignedClient(pool.orch.url, pool.key("n1")) as c:
            return await asyncio.gather(*(c.upload("PUT", slot.url, path, sha)
                                          for _ in range(4)), return_exceptions=True)
    outcomes = run(race())
    ok = [o for o in outcomes if isinstance(o, dict)]
    assert len(ok) == 1
    assert all(isinstance(o, WireHTTPError) and o.status == 409 for o in outcomes if o not in ok)


def test_heartbeat_from_node_not_in_pool(pool: Pool) -> None:
    async def hb() -> Any:  # n5 is on chain (provider p2), not in the pool (test_ledger_rows
        # has it join, and ends with it ejected)
        async with SignedClient(pool.orch.url, pool.key("n5")) as c:
            return await c.call("POST", "/heartbeat", Heartbeat())
    refused(pool, hb, ErrorCode.NOT_IN_POOL)


def test_verdict_from_an_address_without_the_validator_role(pool: Pool) -> None:
    # a file of this test's own in the ledger (none may be before it)
    data = parquet_framed(b"rollout-v" * 1000)
    path, sha = _file(pool, "v", data), hashlib.sha256(data).hexdigest()

    async def upload() -> Any:
        async with SignedClient(pool.orch.url, pool.key("n1")) as c:
            return await c.upload("PUT", (await grant(pool, "n1", data)).url, path, sha)
    assert run(upload())["status"] == "uploaded"

    async def t() -> Any:
        async with SignedClient(pool.orch.url, pool.key("stranger")) as c:
            return await c.call("POST", "/verdicts", Verdict(sha256=sha, verdict="accept"))
    refused(pool, t, ErrorCode.NOT_A_VALIDATOR)


@pytest.mark.parametrize("path, code", [
    ("/files/..%2F..%2Fstate.db", ErrorCode.BAD_FILE_NAME),
    ("/files/%2E%2E", ErrorCode.BAD_FILE_NAME),
    ("/files/" + "0" * 63 + "%2F", ErrorCode.BAD_FILE_NAME),
    ("/uploads/..%2F..%2Fescape", ErrorCode.BAD_SLOT_ID),
])
def test_paths_that_try_to_leave_the_store(pool: Pool, path: str, code: ErrorCode) -> None:
    method = "GET" if path.startswith("/files") else "PUT"

    body = b"" if method == "GET" else b"x"

    async def t() -> Any:
        h = signed(pool, pool.key("trainer" if method == "GET" else "n1"), method, path,
                         body).as_dict()
        return await send(pool.orch.url, method, path, body, h)
    refused(pool, t, code)
    assert not (pool.tmp / "escape").exists()


def test_flood_from_one_address_is_429_while_others_are_served(pool: Pool) -> None:
    async def t() -> None:
        async with SignedClient(pool.orch.url, pool.key("n4")) as flood, \
                SignedClient(pool.orch.url, pool.key("trainer")) as other:
            async def one() -> int:
                try:
                    await flood.call("GET", "/work")  # n4 is not a member: 403 until limited
                    return 200
                except WireHTTPError as e:
                    return e.status
            codes = await asyncio.gather(*(one() for _ in range(120)))
            assert codes.count(429) >= 60 and set(codes) <= {403, 429}
            await other.call("GET", "/ledger", response=LedgerPage)  # served: no 429 raised
    run(t())


def test_slot_beyond_the_unit_and_size_limits(pool: Pool) -> None:
    def ask(units: int, size: int = 100, version: int = 3) -> Callable[[], Awaitable[Any]]:
        async def go() -> Any:
            async with SignedClient(pool.orch.url, pool.key("n1")) as c:
                return await c.call("POST", "/uploads", SlotRequest(
                    sha256="ee" * 32, size=size, policy_version=version,
                    work_units=units, counter=0))
        return go
    refused(pool, ask(10_001), ErrorCode.TOO_MANY_WORK_UNITS)
    refused(pool, ask(10, size=(1 << 21) + 1), ErrorCode.FILE_TOO_LARGE)
    # step 3, async level 1: versions 2, 3
    refused(pool, ask(10, version=1), ErrorCode.STALE_WORK)
