import asyncio
import os
import resource
import signal
import socket
import subprocess
import sys

import pytest

from meshrl.shardcast import (
    ClientConfig,
    OriginConfig,
    OutputWriteError,
    Relay,
    ServerConfig,
    VersionNotFoundError,
)
from meshrl.shardcast.manifest import shard_sha256

from .conftest import (
    PUBLISHER,
    RUN,
    SHARD,
    SRC_ROOT,
    held_polls,
    make_file,
    relay_cfg,
    run,
    signed_client,
    signed_origin,
    streams_open,
    until,
)

FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=10, fsync=False)


async def _origin(tmp_path, **server):
    o = signed_origin(OriginConfig(root=str(tmp_path / "o"), server=ServerConfig(**server)))
    return o, await o.start()


def test_fetch_file_and_directory_and_replace_previous(tmp_path):
    src = make_file(tmp_path / "w.bin", 10 * SHARD + 7, 1)
    ck = tmp_path / "ck"
    make_file(ck / "model.safetensors", 5 * SHARD, 2)
    make_file(ck / "config.json", 30, 3)

    async def main():
        origin, url = await _origin(tmp_path)
        await origin.publish(src, 1, SHARD)
        await origin.publish(ck, 2, SHARD)
        async with signed_client([url], FAST) as c:
            r1 = await c.fetch(tmp_path / "out.bin", 1)
            await c.fetch(tmp_path / "outdir", 2)
            (tmp_path / "outdir" / "stale.txt").write_text("from an older version")
            latest = await c.fetch(tmp_path / "outdir")  # latest = 2 again, replaces the dir
        await origin.stop()
        return r1, latest

    r1, latest = run(main())
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    assert r1.bytes == src.stat().st_size
    assert latest.version == 2
    assert sorted(p.name for p in (tmp_path / "outdir").iterdir()) == [
        "config.json", "model.safetensors"]
    assert (tmp_path / "outdir" / "model.safetensors").read_bytes() == (
        ck / "model.safetensors").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_client_waits_for_a_version_that_does_not_exist_yet(tmp_path):
    src = make_file(tmp_path / "w.bin", 4 * SHARD, 4)

    async def main():
        origin, url = await _origin(tmp_path)
        async with signed_client([url], FAST) as c:
            fetch = asyncio.create_task(c.fetch(tmp_path / "out.bin", 3))
            await until(lambda: held_polls(url), "the client's long poll is held")
            assert not fetch.done()
            await origin.publish(src, 3, SHARD)
            res = await fetch
        await origin.stop()
        return res

    assert run(main()).version == 3
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()


def test_missing_or_pruned_version_is_a_clear_error(tmp_path):
    src = make_file(tmp_path / "w.bin", 1000, 5)

    async def main():
        origin, url = await _origin(tmp_path)
        for v in (1, 2):
            await origin.publish(src, v, SHARD)
        cfg = FAST.model_copy(update={"wait_timeout": 0.3})
        async with signed_client([url], cfg) as c:
            with pytest.raises(VersionNotFoundError, match="no longer held"):
                await c.fetch(tmp_path / "a", 0)  # older than anything held: fail at once
            with pytest.raises(VersionNotFoundError, match="did not appear"):
                await c.fetch(tmp_path / "b", 9)
        await origin.stop()

    run(main())
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_corrupted_relay_is_detected_and_never_written(tmp_path):
    src = make_file(tmp_path / "w.bin", 24 * SHARD, 6)
    data = src.read_bytes()

    async def main():
        origin, url = await _origin(tmp_path, max_upload_mbps=24)
        relay = Relay(relay_cfg(root=str(tmp_path / "r"), upstreams=[url], client=FAST,
                              server=ServerConfig()))
        rurl = await relay.start()
        m = await origin.publish(src, 1, SHARD, piece_size=4096)
        while 1 not in relay.store.complete:
            await asyncio.sleep(0.05)
        stored = tmp_path / "r" / "v1" / "data" / "w.bin"
        with open(stored, "r+b") as f:  # bit rot on the relay's disk: every other shard
            for s in m.shards[::2]:
                f.seek(s.offset + 100)
                f.write(bytes([data[s.offset + 100] ^ 0xFF]))
        written = {s.index: bytearray(s.size) for s in m.shards}

        def sink(index, pos, chunk):
            written[index][pos : pos + len(chunk)] = chunk

        async with signed_client([url, rurl], FAST, seed=1) as c:
            await c.get_manifest(1)
            await c.fetch_shards(m, sink)
            stats = c.pool.stats()
            await c.fetch(tmp_path / "out.bin", 1)
        await relay.stop()
        await origin.stop()
        return m, written, stats, rurl

    m, written, stats, rurl = run(main())
    got = {i: shard_sha256(b, m.piece_size) for i, b in written.items()}
    assert got == {s.index: s.sha256 for s in m.shards}  # only verified bytes reached the sink
    assert stats[rurl]["hash_failures"] >= 1
    assert (tmp_path / "out.bin").read_bytes() == data


def test_disk_full_while_writing_is_a_clear_error(tmp_path):
    src = make_file(tmp_path / "w.bin", 4 * SHARD, 7)

    async def main():
        origin, url = await _origin(tmp_path)
        m = await origin.publish(src, 1, SHARD)
        fd = os.open("/dev/full", os.O_WRONLY)  # every write fails with ENOSPC

        def sink(index, pos, chunk):
            os.write(fd, chunk)

        try:
            async with signed_client([url], FAST) as c:
                await c.get_manifest(1)
                with pytest.raises(OutputWriteError, match="No space left"):
                    await c.fetch_shards(m, sink)
                (tmp_path / "file").write_text("not a directory")
                with pytest.raises(OutputWriteError, match="cannot write"):
                    await c.fetch(tmp_path / "file" / "out.bin", 1)
        finally:
            os.close(fd)
            await origin.stop()

    run(main())


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (3 * SHARD, 3 * SHARD))


def test_file_too_large_keeps_previous_version_intact(tmp_path):
    small = make_file(tmp_path / "v1.bin", 2 * SHARD, 8)
    big = make_file(tmp_path / "v2.bin", 6 * SHARD, 9)
    out = tmp_path / "out" / "weights.bin"

    async def main():
        origin, url = await _origin(tmp_path)
        await origin.publish(small, 1, SHARD)
        await origin.publish(big, 2, SHARD)
        cmd = [sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--publisher", PUBLISHER,
               "--run", RUN, "--server.urls",
               f'["{url}"]', "--out", str(out), "--client.fsync", "false"]
        env = {**os.environ, "PYTHONPATH": str(SRC_ROOT)}
        results = []
        for version in ("1", "2"):
            proc = await asyncio.create_subprocess_exec(
                *cmd, "--version", version, env=env, preexec_fn=_limit_file_size,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            _, err = await proc.communicate()
            results.append((proc.returncode, err.decode()))
        await origin.stop()
        return results

    (rc1, _), (rc2, err2) = run(main())
    assert rc1 == 0
    assert rc2 == 1 and "File too large" in err2 and "cannot write" in err2
    assert out.read_bytes() == small.read_bytes()  # the previous version is intact
    assert os.listdir(out.parent) == ["weights.bin"]  # and no temporary is left behind


def test_follow_calls_back_for_each_new_version(tmp_path):
    srcs = [make_file(tmp_path / f"w{i}.bin", 3 * SHARD + i, 10 + i) for i in range(3)]

    async def main():
        origin, url = await _origin(tmp_path)
        seen, stop = [], asyncio.Event()

        async def on_version(res):
            seen.append((res.version, res.path.read_bytes()))
            if res.version < 2:
                await origin.publish(srcs[res.version + 1], res.version + 1, SHARD)
            else:
                stop.set()

        async with signed_client([url], FAST) as c:
            follower = asyncio.create_task(c.follow(tmp_path / "w", on_version, keep=2, stop=stop))
            await until(lambda: held_polls(url), "the follower's long poll is held")
            await origin.publish(srcs[0], 0, SHARD)
            await asyncio.wait_for(follower, 20)
        await origin.stop()
        return seen

    seen = run(main())
    assert [v for v, _ in seen] == [0, 1, 2]
    assert all(body == srcs[v].read_bytes() for v, body in seen)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v1", "v2"]


def _seconds_to_give_up_a_pruned_version(tmp_path, extra_urls: list[str] = (), **cfg) -> float:
    """Start fetching version 1 over a slow origin (`extra_urls` listed beside it), publish
    version 2 with keep=1 so that version 1 is pruned mid-fetch, and time how long the fetch
    takes to fail with ShardUnavailableError."""
    from meshrl.shardcast import ShardUnavailableError

    src = make_file(tmp_path / "w.bin", 40 * SHARD, 7)

    async def main():
        o = signed_origin(OriginConfig(root=str(tmp_path / "o"), keep=1,
                                       server=ServerConfig(max_connection_mbps=2.0)))
        url = await o.start()
        await o.publish(src, 1, SHARD)
        update = {"wait_timeout": 60, "concurrency": 1, "shard_order": "sequential", **cfg}
        async with signed_client([url, *extra_urls], FAST.model_copy(update=update)) as c:
            fetch = asyncio.create_task(c.fetch(tmp_path / "out.bin", 1))
            await until(lambda: streams_open(url), "a shard of version 1 is streaming")
            assert not fetch.done()
            await o.publish(src, 2, SHARD)  # keep=1: version 1 is pruned once unread
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(ShardUnavailableError):
                await fetch
            waited = asyncio.get_running_loop().time() - t0
        await o.stop()
        return waited

    return run(main())


def test_a_version_pruned_everywhere_mid_fetch_fails_fast(tmp_path):
    """A follower over a slow link that is still fetching a version the servers have pruned
    (a newer one replaced it) gives it up at once instead of waiting `wait_timeout`: the
    follow loop then takes the newest."""
    assert _seconds_to_give_up_a_pruned_version(tmp_path) < 20  # not the 60 s wait_timeout


def test_a_pruned_version_is_given_up_while_another_server_is_unreachable(tmp_path):
    """The cross-host stall: a link cut mid-fetch, and when it comes back the one reachable
    server has pruned the version while another listed server (the origin, behind the cut)
    cannot be reached. No server can bring the version back, so the fetch fails fast and the
    follower takes the newest instead of waiting `wait_timeout` for a server that is gone."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    waited = _seconds_to_give_up_a_pruned_version(tmp_path, [dead], connect_timeout=1.0)
    assert waited < 20  # not the 60 s wait_timeout


def test_the_latest_never_goes_back_when_a_server_withholds_the_newest(tmp_path):
    """Two real servers: the honest origin holds versions 1 and 2, the other withholds 2 and
    serves 1 as its latest. A client that has taken version 2 as the latest, left with the
    withholding server alone, is not rolled back to 1 (no version within its wait, nothing
    written); once a server holds 2 again it gets 2. Versions asked for by number still come."""
    v1, v2 = (make_file(tmp_path / f"w{v}.bin", 2 * SHARD + v, v) for v in (1, 2))
    cfg = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=1.5, fsync=False,
                       long_poll=0.5)

    async def main():
        honest, h_url = await _origin(tmp_path)
        port = int(h_url.rsplit(":", 1)[1])
        await honest.publish(v1, 1, SHARD)
        await honest.publish(v2, 2, SHARD)
        stale = signed_origin(OriginConfig(root=str(tmp_path / "stale"), server=ServerConfig()))
        s_url = await stale.start()
        try:
            async with signed_client([h_url, s_url], cfg) as c:
                first = await c.fetch(tmp_path / "first.bin")  # the stale one holds nothing yet
                await stale.publish(v1, 1, SHARD)  # it serves 1 as its latest, withholding 2
                await honest.stop()  # the honest server is out of reach for a while
                with pytest.raises(VersionNotFoundError, match="version 2 was seen"):
                    await c.fetch(tmp_path / "rolled.bin")
                assert not (tmp_path / "rolled.bin").exists()
                older = await c.fetch(tmp_path / "old.bin", 1)  # by number: not a rollback
                honest = signed_origin(OriginConfig(root=str(tmp_path / "o"),
                                                    server=ServerConfig(port=port)))
                await honest.start()  # back, on the same address, with both versions
                again = await c.fetch(tmp_path / "again.bin")
            return first, older, again
        finally:
            await stale.stop()
            await honest.stop()

    first, older, again = run(main())
    assert (first.version, older.version, again.version) == (2, 1, 2)
    assert (tmp_path / "again.bin").read_bytes() == v2.read_bytes()
    assert (tmp_path / "old.bin").read_bytes() == v1.read_bytes()
