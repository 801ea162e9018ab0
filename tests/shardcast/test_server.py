import asyncio
import time

import aiohttp
import pytest

from meshrl.shardcast import Origin, OriginConfig, ServerConfig

from .conftest import (
    KEY_FILE,
    RUN,
    SHARD,
    get_json,
    held_polls,
    make_file,
    run,
    signed_origin,
    until,
)


def _origin(tmp_path, **server) -> Origin:
    return signed_origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig(**server)))


def test_health_manifest_shards_and_ranges(tmp_path):
    src = make_file(tmp_path / "w.bin", 3 * SHARD + 100, 1)
    data = src.read_bytes()

    async def main():
        origin = _origin(tmp_path)
        url = await origin.start()
        m = await origin.publish(src, 5, SHARD)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/v/5/manifest") as r:
                assert r.status == 200 and await r.read() == m.to_json()
            async with s.get(f"{url}/v/5/shard/1") as r:
                assert r.status == 200 and await r.read() == data[SHARD : 2 * SHARD]
                assert r.headers["X-Shard-Sha256"] == m.shards[1].sha256
            async with s.get(f"{url}/v/5/shard/3", headers={"Range": "bytes=40-"}) as r:
                assert r.status == 206 and await r.read() == data[3 * SHARD + 40 :]
                assert r.headers["Content-Range"] == "bytes 40-99/100"
            async with s.get(f"{url}/v/5/shard/0", headers={"Range": "bytes=10-19"}) as r:
                assert r.status == 206 and await r.read() == data[10:20]
            async with s.get(f"{url}/v/5/shard/3", headers={"Range": "bytes=100-"}) as r:
                assert r.status == 416
            for missing in ("/v/6/manifest", "/v/5/shard/4", "/v/6/shard/0"):
                async with s.get(url + missing) as r:
                    assert r.status == 404, missing
            for missing in ("/v/" + "9" * 20 + "/manifest", "/v/5/shard/" + "1" * 10,
                            "/v/\u0663/manifest"):  # past int64, past 9 digits, an Arabic 3
                async with s.get(url + missing) as r:
                    assert r.status == 404, missing
            for bad, name in (("/versions?after=x", "after"), ("/v/5/have?known=1&wait=y",
                                                                 "known"),
                              ("/versions?wait=nan", "after"), ("/v/5/have?wait=inf", "known"),
                              ("/v/5/have?known=9&wait=nan", "known"),
                              ("/versions?after=" + "9" * 5000, "after")):
                async with s.get(url + bad) as r:
                    assert r.status == 422, bad
                    assert await r.json() == {
                        "error": "invalid query", "code": "invalid_query",
                        "detail": f"{name} must be an integer and wait a finite number of "
                                  "seconds"}
        health = await get_json(f"{url}/health")
        await origin.stop()
        return health

    health = run(main())
    assert health["status"] == "ok" and health["complete"] == [5]
    assert health["counters"]["bytes_sent"] == SHARD + 60 + 10
    assert health["counters"]["shard_misses"] == 1  # /v/6 is refused before


@pytest.mark.timing
def test_long_poll_returns_when_a_version_appears(tmp_path):
    src = make_file(tmp_path / "w.bin", 1000, 2)

    async def main():
        origin = _origin(tmp_path)
        url = await origin.start()
        t0 = time.monotonic()
        poll = asyncio.create_task(get_json(f"{url}/versions?after=-1&wait=20"))
        await until(lambda: held_polls(url), "the long poll is held")
        assert not poll.done()
        await origin.publish(src, 0, SHARD)
        listing = await poll
        await origin.stop()
        return listing, time.monotonic() - t0

    listing, dt = run(main())
    assert listing["complete"] == [0] and dt < 5


def test_version_published_by_another_process_is_picked_up(tmp_path):
    from meshrl.cli import main as cli

    src = make_file(tmp_path / "w.bin", 1000, 3)

    async def main():
        origin = _origin(tmp_path, scan_interval=0.05)
        url = await origin.start()
        poll = asyncio.create_task(get_json(f"{url}/versions?after=-1&wait=20"))
        await until(lambda: held_polls(url), "the long poll is held")  # the scan must wake it
        rc = await asyncio.to_thread(cli, ["shardcast", "publish", "--key_file", KEY_FILE,
                                           "--run", RUN, "--src", str(src),
                                          "--root", str(tmp_path / "o"), "--shard_size", "256"])
        listing = await poll
        await origin.stop()
        return rc, listing

    rc, listing = run(main())
    assert rc == 0 and listing["complete"] == [0]


def test_upload_rate_limit_is_enforced(tmp_path):
    src = make_file(tmp_path / "w.bin", 4 * SHARD, 4)

    async def main():
        origin = _origin(tmp_path, max_upload_mbps=8)
        url = await origin.start()
        await origin.publish(src, 1, SHARD)
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as s:

            async def get(i):
                async with s.get(f"{url}/v/1/shard/{i}") as r:
                    return await r.read()

            await asyncio.gather(*(get(i) for i in range(4)))
        await origin.stop()
        return time.monotonic() - t0

    dt = run(main())
    assert 0.19 <= dt < 2.0  # 262 kB at 1 MB/s shared by 4 requests, less a 50 kB burst


def test_pruned_version_is_hidden_but_finishes_serving(tmp_path):
    from meshrl.shardcast.transport import RawHttpTransport, TransferError

    from .test_transport import receiver

    src = make_file(tmp_path / "w.bin", 2 * SHARD, 5)

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o"), keep=1,
                                            server=ServerConfig(max_upload_mbps=0.8)))
        url = await origin.start()
        m = await origin.publish(src, 1, SHARD)
        (rx, buf), t = receiver(m, 0), RawHttpTransport()
        slow = asyncio.create_task(t.fetch(f"{url}/v/1/shard/0", rx, 5))
        await until(lambda: rx.filled, "the slow read has begun")
        await origin.publish(src, 2, SHARD)  # keep=1: v1 must go, but it is being read
        listing = await get_json(f"{url}/versions")
        v1_on_disk = (tmp_path / "o" / "v1").exists()
        await slow
        await rx.settle()
        try:
            await t.fetch(f"{url}/v/1/shard/1", receiver(m, 1)[0], 5)
            status = 200
        except TransferError as e:
            status = e.status
        await t.close()
        await origin.stop()
        return listing, v1_on_disk, bytes(buf), status

    listing, v1_on_disk, body, status = run(main())
    assert listing["complete"] == [2] and v1_on_disk
    assert body == src.read_bytes()[:SHARD]
    assert status == 404 and not (tmp_path / "o" / "v1").exists()
