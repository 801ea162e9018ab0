"""Delta versions: the codec is bit-exact, a hostile delta only fails, and a client that cannot
use a delta (no base, another base, a base changed on disk, a delta that does not rebuild) gets
the full checkpoint, never other bytes."""

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.shardcast import ClientConfig, OriginConfig, Relay
from meshrl.shardcast.delta import (
    HEADER_SIZE,
    BaseMismatch,
    DeltaError,
    decode_delta,
    encode_delta,
)
from meshrl.shardcast.manifest import DELTA_DIR, FULL_DIR, Manifest, ManifestError, sha256_file

from .conftest import RUN, SHARD, relay_cfg, run, signed_client, signed_origin

FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=10, fsync=False)


def _sha(b: bytes) -> str:
    import hashlib

    return hashlib.sha256(b).hexdigest()


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_any_pair_of_files_round_trips_bit_exactly(target, base):
    d = encode_delta(target, base)
    assert decode_delta(d, base, len(target), _sha(target)) == target


def _weights(seed: int, n: int = 50_000) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.02, n).astype(np.float32)


def test_a_small_update_of_float32_weights_compresses_and_rebuilds_exactly():
    old = _weights(0)
    new = old + np.float32(1e-5) * np.sign(_weights(1))  # one Adam-like step
    new[::97] = -old[::97]  # sign flips too
    new[5] = np.float32("nan")
    t, b = new.tobytes(), old.tobytes()
    d = encode_delta(t, b)
    assert decode_delta(d, b, len(t), _sha(t)) == t
    assert len(d) < 0.55 * len(t), len(d) / len(t)
    assert len(encode_delta(t, t)) < 0.01 * len(t)  # an unchanged file costs next to nothing


def test_a_corrupted_or_mismatched_delta_only_fails():
    old, new = _weights(0).tobytes(), (_weights(0) * 1.001).tobytes()
    d = bytearray(encode_delta(new, old))
    with pytest.raises(BaseMismatch):
        decode_delta(bytes(d), new, len(new), _sha(new))  # another base
    with pytest.raises(DeltaError, match="another target"):
        decode_delta(bytes(d), old, len(new) + 1, _sha(new))  # not the manifest's target
    bad = bytearray(d)
    bad[HEADER_SIZE + len(d) // 3] ^= 0xFF  # damaged body
    with pytest.raises(DeltaError):
        decode_delta(bytes(bad), old, len(new), _sha(new))
    with pytest.raises(DeltaError, match="magic"):
        decode_delta(b"x" * HEADER_SIZE + bytes(d[HEADER_SIZE:]), old, len(new), _sha(new))
    # a frame that inflates far past the target is cut after one byte too many, never held
    huge = encode_delta(bytes(len(new) * 4), bytes(len(new) * 4))
    forged = bytes(d[:HEADER_SIZE]) + huge[HEADER_SIZE:]
    with pytest.raises(DeltaError, match="decompresses to"):
        decode_delta(forged, old, len(new), _sha(new))


def test_a_delta_manifest_must_name_its_base_and_pair_its_files():
    m = Manifest(version=2, kind="dir", shard_size=SHARD, files=(), shards=())
    with pytest.raises(ManifestError, match="older base"):
        Manifest.from_json(json.dumps({**json.loads(m.to_json()), "payload": "delta"}))
    with pytest.raises(ManifestError, match="has no base"):
        Manifest.from_json(json.dumps({**json.loads(m.to_json()), "base": 1}))


def _model_dir(root, seed: int, scale: float = 0.0):
    root.mkdir(parents=True, exist_ok=True)
    w = _weights(seed, 40_000) + np.float32(scale) * np.sign(_weights(seed + 100, 40_000))
    (root / "model.safetensors").write_bytes(w.tobytes())
    (root / "config.json").write_text(json.dumps({"step": scale}))
    return root


def _same(a, b) -> bool:
    return all(sha256_file(a / n) == sha256_file(b / n) for n in ("model.safetensors",
                                                                     "config.json"))


def test_clients_rebuild_deltas_through_a_relay_and_fall_back_to_full(tmp_path, caplog):
    v1 = _model_dir(tmp_path / "m1", 0)
    v2 = _model_dir(tmp_path / "m2", 0, 1e-4)
    v3 = _model_dir(tmp_path / "m3", 0, 2e-4)
    out = tmp_path / "client"

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o")))
        ourl = await origin.start()
        relay = Relay(relay_cfg(root=str(tmp_path / "r"), upstreams=[ourl], client=FAST))
        rurl = await relay.start()
        m1 = await origin.publish(v1, 1, SHARD)
        m2 = await origin.publish(v2, 2, SHARD, delta_from=1)
        assert (m1.payload, m2.payload, m2.base, m2.base_digest) == ("full", "delta", 1,
                                                                     m1.digest)
        assert m2.fetch_size < 0.75 * m2.part_size(FULL_DIR)
        async with signed_client([rurl], FAST) as c:
            r1 = await c.fetch(out / "v1", 1)
            r2 = await c.fetch(out / "v2", 2, held=out)
            assert (r2.payload, r2.fetched_bytes) == ("delta", m2.fetch_size)
            assert _same(out / "v2", v2)
            assert r1.payload == "full"
            # no base held, or the wrong one: the full part, bit-exact
            r = await c.fetch(tmp_path / "nobase", 2)
            assert (r.payload, r.fetched_bytes) == ("full", m2.part_size(FULL_DIR))
            assert _same(tmp_path / "nobase", v2)
            m3 = await origin.publish(v3, 3, SHARD, delta_from=2)
            r = await c.fetch(tmp_path / "only1" / "v3", 3, held=tmp_path / "only1")
            assert r.payload == "full" and _same(tmp_path / "only1" / "v3", v3)
            # a base changed on disk since it was fetched: BaseMismatch, then full
            w = bytearray((out / "v2" / "model.safetensors").read_bytes())
            w[100] ^= 1
            (out / "v2" / "model.safetensors").write_bytes(bytes(w))
            r = await c.fetch(out / "v3", 3, held=out)
            assert r.payload == "full" and _same(out / "v3", v3)
            assert m3.base == 2
        await relay.stop()
        await origin.stop()

    with caplog.at_level(logging.WARNING, logger="meshrl.shardcast.client"):
        run(main(), 60)
    whys = [r.fields["why"] for r in caplog.records if r.getMessage().startswith("delta unus")]
    assert len(whys) == 3, whys
    assert whys[:2] == ["its base version 1 is not held", "its base version 2 is not held"]
    assert whys[2].startswith("BaseMismatch")


def test_a_delta_signed_but_broken_by_its_publisher_yields_the_full_weights(tmp_path, caplog):
    """A publisher bug (a delta that does not rebuild its full file) costs bytes, not
    correctness: the rebuilt file misses the manifest's sha256 and the full part is fetched."""
    from meshrl.shardcast.delta import make_delta_dir
    from meshrl.shardcast.store import VersionStore

    from .conftest import KEY

    v1, v2 = _model_dir(tmp_path / "m1", 0), _model_dir(tmp_path / "m2", 0, 1e-4)
    store = VersionStore(tmp_path / "o", run=RUN)
    m1 = store.publish(v1, 1, SHARD, key=KEY)
    stage = tmp_path / "stage"
    make_delta_dir(v2, v1, stage)
    # a delta of other weights under the right name (a valid frame: only the hash can tell)
    other = _model_dir(tmp_path / "m9", 9)
    make_delta_dir(other, v1, tmp_path / "wrong")
    (stage / DELTA_DIR / "model.safetensors.xorz").write_bytes(
        (tmp_path / "wrong" / DELTA_DIR / "model.safetensors.xorz").read_bytes())
    store.publish(stage, 2, SHARD, key=KEY, payload="delta", base=m1)

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o")))
        url = await origin.start()
        async with signed_client([url], FAST) as c:
            await c.fetch(tmp_path / "c" / "v1", 1)
            r = await c.fetch(tmp_path / "c" / "v2", 2, held=tmp_path / "c")
        await origin.stop()
        return r

    with caplog.at_level(logging.WARNING, logger="meshrl.shardcast.client"):
        r = run(main(), 30)
    assert r.payload == "full" and _same(tmp_path / "c" / "v2", v2)
    assert any(r.fields.get("why", "").startswith("DeltaError: shardcast: delta is for another")
               for r in caplog.records if hasattr(r, "fields"))


@pytest.mark.slow
def test_follow_reports_relays_killed_mid_transfer_and_keeps_the_version_held(tmp_path, caplog):
    """The origin keeps its upload for relays (serve_clients = never); both relays are killed
    (SIGKILL) while a follower fetches version 2 through them: the follower says so within its
    sync_timeout, keeps version 1 as it was, never hangs, and takes version 2 once a relay is
    back (on the same address)."""
    import asyncio
    import contextlib
    import signal

    from meshrl.shardcast import ServerConfig

    from .conftest import PUBLISHER, make_file, spawn_service, streams_open, until

    v1 = make_file(tmp_path / "src1" / "w.bin", 4 * SHARD, 1).parent
    v2 = make_file(tmp_path / "src2" / "w.bin", 48 * SHARD, 2).parent
    out, procs = tmp_path / "follower", []

    def relay(name: str, port: int = 0, mbps: int = 4):  # 4 Mbit/s: slower than sync_timeout
        p, url = spawn_service(["relay", "--publisher", PUBLISHER, "--run", RUN, "--root",
                                str(tmp_path / name), "--upstreams", json.dumps([ourl]),
                                "--server.port", str(port), "--server.max_upload_mbps", str(mbps),
                                "--client.poll_interval", "0.05"], tmp_path / f"{name}.log")
        procs.append(p)
        return p, url

    async def main():
        nonlocal ourl
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o"),
                                            server=ServerConfig(serve_clients="never")))
        ourl = await origin.start()
        (p1, u1), (p2, u2) = relay("r1"), relay("r2")
        await origin.publish(v1, 1, SHARD)
        cfg = ClientConfig(poll_interval=0.05, backoff=0.01, max_backoff=0.2, fsync=False,
                           wait_timeout=30, stall_timeout=1, connect_timeout=0.5,
                           sync_timeout=3, long_poll=1)
        got: list[int] = []
        stop = asyncio.Event()
        async with signed_client([u1, u2, ourl], cfg) as c:
            await c.fetch(out / "v1", 1)
            task = asyncio.create_task(c.follow(out, lambda r: got.append(r.version), after=1,
                                                stop=stop))
            await origin.publish(v2, 2, SHARD)
            while not list(out.glob(".v2.shardcast-*")):  # the transfer has begun
                await asyncio.sleep(0.02)

            async def streaming() -> int:  # shards flow from the relays to the follower
                return await streams_open(u1) + await streams_open(u2)

            await until(streaming, "the relays stream version 2 to the follower")
            for p in (p1, p2):
                p.send_signal(signal.SIGKILL)
            t0 = asyncio.get_running_loop().time()
            while c.sync_failures == 0:
                assert asyncio.get_running_loop().time() - t0 < 10, "the follower hung"
                await asyncio.sleep(0.05)
            assert got == [] and _same_file(out / "v1" / "w.bin", v1 / "w.bin")
            assert not (out / "v2").exists() and not task.done()
            relay("r1", int(u1.rsplit(":", 1)[1]), 1000)  # a relay is back: version 2 arrives
            while got != [2]:
                assert asyncio.get_running_loop().time() - t0 < 40, "version 2 never came"
                await asyncio.sleep(0.05)
            assert _same_file(out / "v2" / "w.bin", v2 / "w.bin") and c.sync_error is None
            stop.set()  # (seen between versions; the wait for version 3 is cancelled)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await origin.stop()

    ourl = ""
    try:
        with caplog.at_level(logging.WARNING, logger="meshrl.shardcast.client"):
            run(main(), 90)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = [r for r in caplog.records if r.getMessage() == "version sync failed"]
    assert lines and lines[0].fields["version"] == 2 and lines[0].fields["serving"] == 1


def _same_file(a, b) -> bool:
    return sha256_file(a) == sha256_file(b)
