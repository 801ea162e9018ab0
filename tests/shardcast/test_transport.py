import hashlib
import time

import aiohttp
import pytest

from meshrl.shardcast import ClientConfig, Origin, OriginConfig, ServerConfig, ShardcastClient
from meshrl.shardcast.pool import ServerPool
from meshrl.shardcast.transport import (
    AiohttpTransport,
    RawHttpTransport,
    ShardBuffer,
    TransferError,
)

from .conftest import SHARD, make_file, run


@pytest.mark.parametrize("kind", ["raw", "aiohttp"])
def test_transports_fetch_resume_and_fail_cleanly(tmp_path, kind):
    src = make_file(tmp_path / "w.bin", 2 * SHARD + 10, 1)
    data = src.read_bytes()

    async def main():
        origin = Origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig()))
        url = await origin.start()
        await origin.publish(src, 1, SHARD)
        async with aiohttp.ClientSession() as session:
            t = RawHttpTransport() if kind == "raw" else AiohttpTransport(session)
            buf = ShardBuffer(SHARD)
            for _ in range(3):  # keep-alive connections are reused
                buf.reset(SHARD)
                await t.fetch(f"{url}/v/1/shard/1", buf, 5)
                assert bytes(buf.view()) == data[SHARD : 2 * SHARD]
            buf.reset(SHARD)
            buf.data[:1000] = data[:1000]
            buf.filled = 1000  # resume: only the rest is requested
            await t.fetch(f"{url}/v/1/shard/0", buf, 5)
            assert bytes(buf.view()) == data[:SHARD]
            buf.reset(10)
            await t.fetch(f"{url}/v/1/shard/2", buf, 5)
            assert bytes(buf.view()) == data[2 * SHARD :]
            with pytest.raises(TransferError) as err:
                await t.fetch(f"{url}/v/1/shard/9", buf, 5)
            assert err.value.status == 404
            small = ShardBuffer(100)  # the server sends more than the manifest promised
            with pytest.raises(TransferError):
                await t.fetch(f"{url}/v/1/shard/0", small, 5)
            await t.close()
        sent = origin.server.counters
        await origin.stop()
        return sent

    counters = run(main())
    assert counters["range_requests"] == 1


def test_aiohttp_transport_fetches_a_whole_version(tmp_path):
    src = make_file(tmp_path / "w.bin", 5 * SHARD, 2)

    async def main():
        origin = Origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig()))
        url = await origin.start()
        await origin.publish(src, 1, SHARD)
        async with ShardcastClient([url], ClientConfig(transport="aiohttp", fsync=False)) as c:
            assert isinstance(c.transport, AiohttpTransport)
            await c.fetch(tmp_path / "out", 1)
        await origin.stop()

    run(main())
    assert hashlib.sha256((tmp_path / "out").read_bytes()).digest() == hashlib.sha256(
        src.read_bytes()).digest()


def test_pool_prefers_fast_servers_and_forgives_failures():
    pool = ServerPool(["http://a", "http://b"], failure_decay=1.0, seed=0)
    a, b = pool.servers["http://a"], pool.servers["http://b"]
    for s in (a, b):
        s.manifest_digest, s.complete = "d", True
    pool.record_success(a, 10_000_000, 1.0)  # 10 MB/s
    pool.record_success(b, 1_000_000, 1.0)  # 1 MB/s
    picks = [pool.choose(0, "d").url for _ in range(2000)]
    assert 0.85 < picks.count("http://a") / 2000 < 0.95  # ~10:1 by throughput
    pool.record_failure(a, 5.0)
    assert pool.weight(a) < pool.weight(b)  # a failing server is avoided...
    later = time.monotonic() + 10
    assert pool.weight(a, later) > pool.weight(b, later)  # ...until its failures fade
    assert pool.choose(0, "other") is None  # servers with another manifest are never used
    assert pool.choose(0, "d", avoid={"http://a"}).url == "http://b"
    b.complete = False
    assert pool.choose(0, "d", avoid={"http://a"}).url == "http://a"  # only a holds shard 0


def test_pool_needs_a_server():
    with pytest.raises(ValueError):
        ServerPool([])
