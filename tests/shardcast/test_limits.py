"""Upload limits and who gets the upload: rates, relays before clients, spare / never, slices."""

import asyncio
import time

import aiohttp
import pytest

from meshrl.shardcast import (
    ClientConfig,
    OriginConfig,
    Relay,
    ServerConfig,
    ShardUnavailableError,
)
from meshrl.shardcast.transport import RELAY_HEADER, RawHttpTransport, TransferError

from .conftest import (
    SHARD,
    get_json,
    make_file,
    relay_cfg,
    run,
    signed_client,
    signed_origin,
    until,
)
from .test_transport import receiver

# rates and who gets the upload, measured in wall-clock time: run alone (tests/conftest.py)
pytestmark = pytest.mark.timing

FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=15, fsync=False)
RELAY = {RELAY_HEADER: "1"}


async def _origin(tmp_path, src, **server):
    o = signed_origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig(**server)))
    url = await o.start()
    m = await o.publish(src, 1, SHARD)
    return o, url, m


# A limiter must never let more through than its limit (10% for the clock's grain); below it,
# a loaded 2-core machine (the full suite, CI) cannot always keep up, which is not the limiter's
# fault: idle, these rates land within 10% of the limit.


async def _get_all(session, url, shards, headers=None):
    """Every shard, one after another on this session; the bytes received."""
    n = 0
    for i in shards:
        async with session.get(f"{url}/v/1/shard/{i}", headers=headers) as r:
            assert r.status == 200, r.status
            n += len(await r.read())
    return n


def test_server_wide_rate_is_at_most_its_limit(tmp_path):
    src = make_file(tmp_path / "w.bin", 48 * SHARD, 1)  # 3.1 MB at 2 MB/s: ~1.6 s

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=16)
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            got = await asyncio.gather(*(_get_all(s, url, range(k, 48, 4)) for k in range(4)))
            dt = time.monotonic() - t0
        await origin.stop()
        return sum(got), dt

    nbytes, dt = run(main())
    assert nbytes == 48 * SHARD
    assert 0.6 * 2_000_000 < nbytes / dt <= 1.1 * 2_000_000  # see the note above _get_all


def test_per_connection_rate_is_at_most_its_limit(tmp_path):
    src = make_file(tmp_path / "w.bin", 32 * SHARD, 2)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_connection_mbps=8)  # 1 MB/s each

        async def one_connection(shards):
            conn = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=conn) as s:
                t0 = time.monotonic()
                n = await _get_all(s, url, shards)
                return n / (time.monotonic() - t0)

        rates = await asyncio.gather(one_connection(range(16)), one_connection(range(16, 32)))
        await origin.stop()
        return rates

    for rate in run(main()):  # two connections, each at its own limit (no server-wide cap)
        assert 0.6 * 1_000_000 < rate <= 1.1 * 1_000_000  # see the note above _get_all


def test_relays_are_served_before_clients(tmp_path):
    src = make_file(tmp_path / "w.bin", 16 * SHARD, 3)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=8, serve_clients="always")
        client_bytes = [0]

        async def client(s):  # reads as it arrives, counting
            for i in range(16):
                async with s.get(f"{url}/v/1/shard/{i}") as r:
                    async for chunk in r.content.iter_any():
                        client_bytes[0] += len(chunk)

        async with aiohttp.ClientSession() as s:
            reader = asyncio.create_task(client(s))
            # the client streams alone (it has the upload), then two relay streams start
            before = await until(lambda: client_bytes[0], "the client receives bytes alone")
            await asyncio.gather(_get_all(s, url, range(0, 16, 2), RELAY),
                                 _get_all(s, url, range(1, 16, 2), RELAY))
            during = client_bytes[0] - before
            await reader
        health = await get_json(f"{url}/health")
        await origin.stop()
        return before, during, health["counters"]

    before, during, counters = run(main())
    assert before > 0  # alone, the client had the upload
    assert during < 0.1 * 16 * SHARD  # while relays wanted it, they had (nearly) all of it
    assert counters["bytes_sent_relays"] == 16 * SHARD
    assert counters["bytes_sent"] == 32 * SHARD


def test_spare_refuses_clients_while_relays_saturate_the_upload(tmp_path):
    src = make_file(tmp_path / "w.bin", 16 * SHARD, 4)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=8, serve_clients="spare")
        statuses = []
        async with aiohttp.ClientSession() as s:
            relay = asyncio.create_task(_get_all(s, url, range(16), RELAY))
            await until(lambda: _admitted(url, False), "the relay saturates the upload")
            async with s.get(f"{url}/v/1/shard/0", headers={"Range": "bytes=0-"}) as r:
                statuses.append((r.status, r.headers.get("Retry-After")))
            await relay
            await until(lambda: _admitted(url, True), "relays gone: capacity is spare again")
            async with s.get(f"{url}/v/1/shard/0", headers={"Range": "bytes=0-"}) as r:
                body = await r.read()
                statuses.append((r.status, r.headers.get("Content-Range")))
        await origin.stop()
        return statuses, body

    statuses, body = run(main())
    assert statuses[0] == (503, "1")
    assert statuses[1] == (206, f"bytes 0-{SHARD - 1}/{SHARD}")  # a slice: 1 MiB > the shard
    assert body == src.read_bytes()[:SHARD]


async def _admitted(url: str, expected: bool) -> bool:
    """Whether the server at `url` says a client is `expected` to be admitted now."""
    return (await get_json(f"{url}/health"))["clients_admitted"] is expected


def test_origin_that_never_serves_clients_feeds_them_through_a_relay(tmp_path):
    src = make_file(tmp_path / "w.bin", 12 * SHARD, 5)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, serve_clients="never")
        relay = Relay(relay_cfg(root=str(tmp_path / "r"), upstreams=[url], client=FAST,
                                server=ServerConfig()))
        rurl = await relay.start()
        async with aiohttp.ClientSession() as s, s.get(f"{url}/v/1/shard/0") as r:
            refused = r.status
        async with signed_client([url, rurl], FAST, seed=0) as c:
            res = await c.fetch(tmp_path / "out.bin", 1)
        lonely = FAST.model_copy(update={"wait_timeout": 0.5})
        async with signed_client([url], lonely) as c:
            with pytest.raises(ShardUnavailableError):
                await c.fetch(tmp_path / "never.bin", 1)
        health = await get_json(f"{url}/health")
        await relay.stop()
        await origin.stop()
        return refused, res, health["counters"], url, rurl

    refused, res, counters, url, rurl = run(main())
    assert refused == 403
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert res.servers[rurl]["bytes"] == 12 * SHARD and res.servers[url]["failures"] == 0
    assert counters["bytes_sent"] == counters["bytes_sent_relays"] == 12 * SHARD


def test_client_sliced_by_a_spare_origin_asks_again_without_failures(tmp_path):
    src = make_file(tmp_path / "w.bin", 6 * SHARD, 6)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=80, serve_clients="spare",
                                       spare_slice=SHARD // 4)
        async with signed_client([url], FAST) as c:
            res = await c.fetch(tmp_path / "out.bin", 1)
        health = await get_json(f"{url}/health")
        await origin.stop()
        return res, health["counters"], url

    res, counters, url = run(main())
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert counters["shard_requests"] == 6 * 4 and res.servers[url]["failures"] == 0


def test_client_stream_cut_for_relays_reads_as_busy(tmp_path):
    src = make_file(tmp_path / "w.bin", 8 * SHARD, 7)

    async def main():
        origin, url, m = await _origin(tmp_path, src, max_upload_mbps=2, serve_clients="always",
                                       preempt_after=0.3)
        (rx, _), t = receiver(m, 0), RawHttpTransport()
        client = asyncio.create_task(t.fetch(f"{url}/v/1/shard/0", rx, 5))
        while rx.filled == 0:  # the client's answer has begun
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as s:  # then relays take the whole upload
            relays = asyncio.gather(*(_get_all(s, url, [i], RELAY) for i in range(1, 8)))
            with pytest.raises(TransferError) as cut:
                await client
            await relays
        await t.close()
        health = await get_json(f"{url}/health")
        await origin.stop()
        return cut.value, rx.filled, health["counters"]

    cut, filled, counters = run(main())
    assert cut.status == 503 and 0 < filled < SHARD
    assert counters["preempted"] == 1 and counters["bytes_sent_relays"] == 7 * SHARD


def test_client_finds_relays_slower_than_the_origin_and_still_completes(tmp_path):
    src = make_file(tmp_path / "w.bin", 24 * SHARD, 8)  # 1.6 MB; the relay alone: ~13 s

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=40, serve_clients="spare")
        relay = Relay(relay_cfg(root=str(tmp_path / "r"), upstreams=[url], client=FAST,
                                server=ServerConfig(max_upload_mbps=1)))
        rurl = await relay.start()
        while 1 not in relay.store.complete:
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        async with signed_client([url, rurl], FAST, seed=0) as c:
            res = await c.fetch(tmp_path / "out.bin", 1)
        dt = time.monotonic() - t0
        await relay.stop()
        await origin.stop()
        return res, dt, url, rurl

    res, dt, url, rurl = run(main())
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert res.servers[url]["bytes"] > 3 * res.servers[rurl]["bytes"] and dt < 5
    assert res.servers[rurl]["role"] == "relay" and res.servers[url]["role"] == "origin"


def test_three_level_chain_with_limits_each_level_mirrors_from_the_one_above(tmp_path):
    """origin → relay1 → relay2, clients on relay1 and on relay2, every upload capped."""
    src = make_file(tmp_path / "w.bin", 16 * SHARD, 9)
    limited = ServerConfig(max_upload_mbps=16)

    async def main():
        origin, url, _ = await _origin(tmp_path, src, max_upload_mbps=16)
        r1 = Relay(relay_cfg(root=str(tmp_path / "r1"), upstreams=[url], client=FAST,
                             server=limited))
        r1url = await r1.start()
        r2 = Relay(relay_cfg(root=str(tmp_path / "r2"), upstreams=[r1url], client=FAST,
                             server=limited))
        r2url = await r2.start()
        async with signed_client([r1url], FAST) as c1, signed_client([r2url], FAST) as c2:
            await asyncio.gather(c1.fetch(tmp_path / "c1.bin", 1), c2.fetch(tmp_path / "c2.bin", 1))
        h = [await get_json(f"{u}/health") for u in (url, r1url, r2url)]
        for service in (r2, r1, origin):
            await service.stop()
        return [x["counters"] for x in h]

    o, r1, r2 = run(main())
    for name in ("c1.bin", "c2.bin"):
        assert (tmp_path / name).read_bytes() == src.read_bytes()
    size = 16 * SHARD
    assert o["bytes_sent"] == o["bytes_sent_relays"] == size  # the origin fed relay1 only
    assert r1["bytes_received"] == size and r1["bytes_sent_relays"] == size  # relay2 from it
    assert r1["bytes_sent"] == 2 * size and r2["bytes_sent"] == size
