import contextlib
import hashlib
import time

import aiohttp
import pytest

from meshrl.shardcast import ClientConfig, OriginConfig, ServerConfig
from meshrl.shardcast.errors import OutputWriteError
from meshrl.shardcast.pool import ServerPool
from meshrl.shardcast.transport import (
    AiohttpTransport,
    PieceMismatchError,
    RawHttpTransport,
    ShardReceiver,
    TransferError,
)

from .conftest import SHARD, make_file, run, signed_client, signed_origin

PIECE = 4096  # 16 pieces per test shard


def receiver(m, index, digests=None, size=None, depth=0):
    """A receiver for shard `index` of `m` and the bytearray its sink writes into."""
    shard = m.shards[index]
    size = shard.size if size is None else size
    got = bytearray(size)

    def sink(pos, data):
        got[pos : pos + len(data)] = data

    if digests is None:
        digests = [shard.piece_digest(j) for j in range(m.piece_count(shard))]
    return ShardReceiver(size, m.piece_size, digests, sink, depth), got


@pytest.mark.parametrize("depth", [0, 1, 3])  # inline, or in worker threads
def test_receiver_verifies_piece_by_piece_and_only_writes_verified_bytes(depth):
    data = bytes(range(10))
    digests = [hashlib.sha256(data[i : i + 4]).hexdigest() for i in range(0, 10, 4)]

    async def main():
        got = bytearray(10)
        written = []

        def sink(pos, chunk):
            written.append(pos)
            got[pos : pos + len(chunk)] = chunk

        rx = ShardReceiver(10, 4, digests, sink, depth)
        for a, b in [(0, 3), (3, 9), (9, 10)]:  # chunks that straddle pieces
            rx.feed(data[a:b])
        await rx.settle()
        assert rx.complete and got == data and sorted(written) == [0, 4, 8]
        with pytest.raises(TransferError):
            rx.feed(b"x")  # longer than the shard

        wrong = [digests[0], "0" * 64, digests[2]]
        bad = ShardReceiver(10, 4, wrong, lambda pos, chunk: written.append(pos), depth)
        bad.source = "http://evil"
        written.clear()
        bad.feed(data)
        with pytest.raises(PieceMismatchError) as e:
            await bad.settle()
        assert e.value.pos == 4 and e.value.sources == {"http://evil"}
        assert 4 not in written and bad.filled == 4 and not bad.complete  # resume at the bad piece

        def full(pos, chunk):
            raise OSError(28, "No space left on device")

        rx = ShardReceiver(10, 4, digests, full, depth)
        rx.feed(data)
        with pytest.raises(OutputWriteError, match="No space left"):
            await rx.settle()
        with pytest.raises(ValueError):
            ShardReceiver(10, 4, digests[:2], sink)

    run(main())


@pytest.mark.parametrize("depth", [0, 2])  # pieces verified inline / in threads
@pytest.mark.parametrize("kind", ["raw", "aiohttp"])
def test_transports_fetch_resume_and_fail_cleanly(tmp_path, kind, depth):
    src = make_file(tmp_path / "w.bin", 2 * SHARD + 10, 1)
    data = src.read_bytes()

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig()))
        url = await origin.start()
        m = await origin.publish(src, 1, SHARD, piece_size=PIECE)
        async with aiohttp.ClientSession() as session:
            t = RawHttpTransport() if kind == "raw" else AiohttpTransport(session)
            for _ in range(3):  # keep-alive connections are reused
                rx, got = receiver(m, 1, depth=depth)
                await t.fetch(f"{url}/v/1/shard/1", rx, 5)
                await rx.settle()
                assert rx.complete and got == data[SHARD : 2 * SHARD]
            rx, got = receiver(m, 0, depth=depth)
            rx.feed(data[:1000])  # received earlier: only the rest is requested
            await t.fetch(f"{url}/v/1/shard/0", rx, 5)
            await rx.settle()
            assert rx.complete and got == data[:SHARD]
            rx, got = receiver(m, 2, depth=depth)
            await t.fetch(f"{url}/v/1/shard/2", rx, 5)
            await rx.settle()
            assert rx.complete and got == data[2 * SHARD :]
            with pytest.raises(TransferError) as err:
                await t.fetch(f"{url}/v/1/shard/9", receiver(m, 2, depth=depth)[0], 5)
            assert err.value.status == 404
            small, _ = receiver(m, 2, size=10)  # the server sends more than the manifest promised
            with pytest.raises(TransferError):
                await t.fetch(f"{url}/v/1/shard/0", small, 5)
            digests = [m.shards[0].piece_digest(j) for j in range(SHARD // PIECE)]
            digests[2] = "0" * 64  # the server's piece 2 will not match
            rx, got = receiver(m, 0, digests, depth=depth)
            with contextlib.suppress(PieceMismatchError):  # raw aborts the transfer at once
                await t.fetch(f"{url}/v/1/shard/0", rx, 5)
            with pytest.raises(PieceMismatchError) as bad:
                await rx.settle()
            assert bad.value.pos == 2 * PIECE and rx.filled == 2 * PIECE
            assert got[: 2 * PIECE] == data[: 2 * PIECE]
            assert got[2 * PIECE : 3 * PIECE] == bytes(PIECE)  # never written
            await t.close()
        sent = origin.server.counters
        await origin.stop()
        return sent

    counters = run(main())
    assert counters["range_requests"] == 1


@pytest.mark.parametrize(("kind", "in_flight"), [("aiohttp", 0), ("raw", 2)])
def test_transports_fetch_a_whole_version(tmp_path, kind, in_flight):
    src = make_file(tmp_path / "w.bin", 5 * SHARD, 2)

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig()))
        url = await origin.start()
        await origin.publish(src, 1, SHARD, piece_size=PIECE)
        cfg = ClientConfig(transport=kind, fsync=False, pieces_in_flight=in_flight)
        async with signed_client([url], cfg) as c:
            want = AiohttpTransport if kind == "aiohttp" else RawHttpTransport
            assert isinstance(c.transport, want)
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


def test_idle_connection_never_offers_an_empty_buffer():
    from meshrl.shardcast.transport import _HEAD_MAX, _Response

    proto = _Response()
    proto.head_n = _HEAD_MAX  # a first read filled the head buffer (head + start of the body)
    assert len(proto.get_buffer(-1)) > 0  # asyncio treats an empty buffer as a fatal error
