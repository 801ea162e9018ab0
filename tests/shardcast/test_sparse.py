"""Sparse value deltas of bfloat16 checkpoints (shardcast/sparse.py): bit-exact on real
optimizer steps, a hand-built file decoded as computed by hand, every forgery refused with its
typed reason, the file-level codec for anything else, the full version when a delta would not be
smaller, and a client rebuilding a bf16 delta version fetched from a real origin."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.shardcast import ClientConfig, OriginConfig
from meshrl.shardcast.delta import (
    HEADER_SIZE,
    BaseMismatch,
    DeltaError,
    DeltaFault,
    decode_delta,
    encode_delta,
    encode_words,
    make_delta_dir,
    reconstruct,
)
from meshrl.shardcast.manifest import DELTA_DIR, FULL_DIR, sha256_file
from meshrl.shardcast.sparse import MAGIC, bf16_layout
from meshrl.shardcast.store import VersionStore

from .conftest import KEY, RUN, SHARD, run, signed_client, signed_origin

FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=10, fsync=False)
WEIGHTS = "model.safetensors"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _st(tensors: dict[str, np.ndarray], dtype: str = "BF16") -> bytes:
    """A safetensors file of uint16 words labelled `dtype`, tensors in the given order."""
    head, at = {}, 0
    for name, w in tensors.items():
        head[name] = {"dtype": dtype, "shape": [len(w)], "data_offsets": [at, at + 2 * len(w)]}
        at += 2 * len(w)
    js = json.dumps(head).encode()
    js += b" " * (-len(js) % 8)
    return len(js).to_bytes(8, "little") + js + b"".join(
        w.astype("<u2").tobytes() for w in tensors.values())


def _pair() -> tuple[bytes, bytes]:
    """Base and target by hand: tensor a (6 words) all changed -> a bitmap; tensor b (1000
    words) changed at 3, 10 and 500 -> gaps 4, 7, 490."""
    a = np.arange(100, 106, dtype=np.uint16)
    b = np.arange(1000, dtype=np.uint16)
    a2, b2 = a + 1, b.copy()
    b2[[3, 10, 500]] = [0x3F80, 0x7FC1, 0x8000]  # 1.0, a NaN payload, -0.0: bits, not values
    return _st({"a": a2, "b": b2}), _st({"a": a, "b": b})


def _body(delta: bytes) -> bytearray:
    return bytearray(zstandard.ZstdDecompressor().decompress(delta[HEADER_SIZE:],
                                                             max_output_size=1 << 20))


def _forge(delta: bytes, body: bytes | bytearray) -> bytes:
    return delta[:HEADER_SIZE] + zstandard.ZstdCompressor().compress(bytes(body))


def test_a_hand_built_pair_encodes_as_computed_and_rebuilds_exactly():
    target, base = _pair()
    d = encode_delta(target, base)
    assert d[:10] == MAGIC
    body = _body(d)
    # table: a (mode 2, count 6), b (mode 1, count 3); gaps 4, 7, 490 in 4 byte planes; the
    # bitmap 0b111111; the 9 new values in 2 byte planes
    assert body[:18] == bytes([2, 6, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 0])
    assert body[18:30] == bytes([4, 7, 490 & 255, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    assert body[30] == 0x3F
    values = [101, 102, 103, 104, 105, 106, 0x3F80, 0x7FC1, 0x8000]
    assert body[31:] == bytes([v & 255 for v in values] + [v >> 8 for v in values])
    assert len(body) == 18 + 12 + 1 + 18
    assert decode_delta(d, base, len(target), _sha(target)) == target


def _tiny_bf16_versions(root: Path, lrs: tuple[float, ...]) -> list[Path]:
    """A tiny Llama saved in bfloat16 before and after AdamW steps at each of `lrs` (the
    trainer's betas and clipping), on a next-token loss over fixed random tokens."""
    tok = CharTokenizer()
    model = build_model("llama-tiny", tok.vocab_size, seed=4)
    opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], betas=(0.9, 0.99), eps=1e-8,
                            weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    dirs = [save_model(model, tok, root / "v0", dtype=torch.bfloat16)]
    for i, lr in enumerate(lrs):
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.randint(0, tok.vocab_size, (2, 24), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dirs.append(save_model(model, tok, root / f"v{i + 1}", dtype=torch.bfloat16))
    return dirs


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> list[Path]:
    return _tiny_bf16_versions(tmp_path_factory.mktemp("bf16"), (1e-6, 1e-6, 1e-5, 1e-3))


@pytest.mark.slow  # real optimizer steps on a bf16 model: not in test-fast
def test_real_optimizer_steps_round_trip_bit_exactly_and_small(versions):
    sizes, magics = [], []
    for old, new in itertools.pairwise(versions):
        t, b = (new / WEIGHTS).read_bytes(), (old / WEIGHTS).read_bytes()
        assert t != b
        d = encode_delta(t, b)
        assert decode_delta(d, b, len(t), _sha(t)) == t
        assert len(d) <= len(encode_words(t, b))
        sizes.append(len(d) / len(t))
        magics.append(d[:10])
    # lr 1e-6: a few percent of the values change, the sparse codec wins, under 10% of full
    assert magics[:2] == [MAGIC, MAGIC] and max(sizes[:2]) < 0.10, sizes
    # lr 1e-3 changes most values: the file-level word difference is the smaller one
    assert magics[3] == b"MRLDELTA1\n" and sizes[3] > sizes[2] > sizes[0], sizes


def test_the_delta_directory_rebuilds_every_file(versions, tmp_path):
    old, new = versions[0], versions[1]
    size = make_delta_dir(new, old, tmp_path / "stage")
    assert size == sum(p.stat().st_size for p in (tmp_path / "stage" / DELTA_DIR).iterdir())
    store = VersionStore(tmp_path / "o", run=RUN)
    store.publish(old, 1, SHARD, key=KEY)
    m = store.publish_delta(new, 2, 1, SHARD, key=KEY)
    assert m.payload == "delta"
    fetched = store.version_dir(2) / "data"
    reconstruct(m, fetched, old, tmp_path / "rebuilt")
    for p in new.iterdir():
        assert sha256_file(tmp_path / "rebuilt" / p.name) == sha256_file(p)
    assert (fetched / DELTA_DIR / f"{WEIGHTS}.xorz").read_bytes()[:10] == MAGIC


@pytest.mark.parametrize("forge, reason", [
    # the last gap 490 -> 490 + 512: position 1012 of a 1000-word tensor
    (lambda b: b.__setitem__(18 + 3 + 2, 3), DeltaFault.BAD_POSITIONS),
    # the second gap 7 -> 0: position 3 twice (not strictly increasing)
    (lambda b: b.__setitem__(18 + 1, 0), DeltaFault.BAD_POSITIONS),
    # a bitmap bit past tensor a's 6 words
    (lambda b: b.__setitem__(30, 0xFF), DeltaFault.BAD_POSITIONS),
    # b's count 3 -> 2000: over its 1000 words
    (lambda b: b.__setitem__(slice(10, 12), (2000).to_bytes(2, "little")), DeltaFault.BAD_COUNTS),
    # a's count 6 -> 0 while its mode says changed
    (lambda b: b.__setitem__(1, 0), DeltaFault.BAD_COUNTS),
    # b's count 3 -> 4: the body ends before the counts' bytes do
    (lambda b: b.__setitem__(10, 4), DeltaFault.TRUNCATED),
    # a's count 6 -> 5 and one value fewer: the sizes agree, the bitmap (6 bits) does not
    (lambda b: (b.__setitem__(1, 5), b.__delitem__(slice(31, 33))), DeltaFault.BAD_COUNTS),
    # a mode that does not exist
    (lambda b: b.__setitem__(0, 7), DeltaFault.MALFORMED),
    # a megabyte of zeros past the counts' bytes: never inflated past one byte
    (lambda b: b.extend(bytes(1 << 20)), DeltaFault.OVERSIZED),
    # the table cut short
    (lambda b: b.__delitem__(slice(10, None)), DeltaFault.TRUNCATED),
    # a forged value: a well-formed delta of other weights, only the hash can tell
    (lambda b: b.__setitem__(31, b[31] ^ 1), DeltaFault.HASH_MISMATCH),
])
def test_a_forged_sparse_delta_is_refused_with_its_reason(forge, reason):
    target, base = _pair()
    d = encode_delta(target, base)
    body = _body(d)
    forge(body)
    with pytest.raises(DeltaError) as e:
        decode_delta(_forge(d, body), base, len(target), _sha(target))
    assert e.value.reason == reason, e.value


def test_a_truncated_frame_a_wrong_base_or_target_only_fails():
    target, base = _pair()
    d = encode_delta(target, base)
    with pytest.raises(DeltaError) as e:
        decode_delta(d[:HEADER_SIZE + (len(d) - HEADER_SIZE) // 2], base, len(target),
                     _sha(target))
    assert e.value.reason in (DeltaFault.TRUNCATED, DeltaFault.UNDECODABLE)
    with pytest.raises(DeltaError) as e:
        decode_delta(d[:HEADER_SIZE] + b"not a zstd frame" * 4, base, len(target),
                     _sha(target))
    assert e.value.reason == DeltaFault.UNDECODABLE
    with pytest.raises(BaseMismatch) as e:
        decode_delta(d, target, len(target), _sha(target))
    assert e.value.reason == DeltaFault.WRONG_BASE
    with pytest.raises(DeltaError) as e:
        decode_delta(d, base, len(target), _sha(base))
    assert e.value.reason == DeltaFault.WRONG_TARGET


def test_a_sparse_delta_on_a_base_that_is_not_bf16_is_refused():
    """A header naming a float32 base under the sparse magic (only a forger makes one)."""
    target, base = (_st({"w": np.arange(8, dtype=np.uint16) + k}, "F16") for k in (1, 0))
    d = encode_delta(target, base)
    assert d[:10] != MAGIC  # F16 is not the sparse codec's
    with pytest.raises(DeltaError) as e:
        decode_delta(MAGIC + d[10:], base, len(target), _sha(target))
    assert e.value.reason == DeltaFault.MALFORMED


@pytest.mark.parametrize("other", [
    lambda a, b: _st({"renamed": a, "b": b}),  # a name differs
    lambda a, b: _st({"b": b, "a": a}),  # the order (offsets) differs
    lambda a, b: _st({"a": a, "b": b}, "F16"),  # the dtype differs
    lambda a, b: (a.tobytes() + b.tobytes()),  # not safetensors at all
])
def test_anything_but_two_bf16_files_with_one_header_takes_the_file_level_codec(other):
    a, b = np.arange(6, dtype=np.uint16), np.arange(1000, dtype=np.uint16)
    _, base = _pair()
    target = other(a + 3, b)
    d = encode_delta(target, base)
    assert d[:10] == b"MRLDELTA1\n"
    assert decode_delta(d, base, len(target), _sha(target)) == target


def test_the_layout_is_none_for_holes_overlaps_and_lies():
    a = np.arange(4, dtype=np.uint16)
    good = _st({"a": a})
    assert bf16_layout(good) == (len(good) - 8, [(0, 4)])
    head = json.loads(good[8:len(good) - 8])
    for bad in ({"a": {**head["a"], "data_offsets": [2, 10]}},  # a hole before it
                {"a": {**head["a"], "shape": [5]}},  # a shape its bytes belie
                {"a": head["a"], "b": head["a"]}):  # two tensors on the same bytes
        js = json.dumps(bad).encode()
        assert bf16_layout(len(js).to_bytes(8, "little") + js + a.tobytes()) is None
    assert bf16_layout(b"\xff" * 8 + good[8:]) is None  # a header length past the file


def test_the_publisher_picks_the_full_version_when_the_delta_is_not_smaller(tmp_path):
    rng = np.random.default_rng(0)
    for name, seed in (("v1", 1), ("v2", 2)):
        (tmp_path / name).mkdir()
        w = np.random.default_rng(seed).integers(0, 1 << 16, 20_000, dtype=np.uint16)
        (tmp_path / name / WEIGHTS).write_bytes(_st({"w": w}))
    (tmp_path / "v3").mkdir()
    w = np.frombuffer((tmp_path / "v2" / WEIGHTS).read_bytes()[-40_000:], np.uint16).copy()
    w[rng.choice(len(w), 20, replace=False)] += 1
    (tmp_path / "v3" / WEIGHTS).write_bytes(_st({"w": w}))
    store = VersionStore(tmp_path / "o", run=RUN)
    store.publish(tmp_path / "v1", 1, SHARD, key=KEY)
    m2 = store.publish_delta(tmp_path / "v2", 2, 1, SHARD, key=KEY)  # every value changed
    assert (m2.payload, m2.base) == ("full", None)
    m3 = store.publish_delta(tmp_path / "v3", 3, 2, SHARD, key=KEY)  # 20 values changed
    assert (m3.payload, m3.base) == ("delta", 2)
    assert m3.part_size(DELTA_DIR) < 0.02 * m3.part_size(FULL_DIR)


def test_a_client_fetches_a_bf16_delta_version_from_an_origin_and_rebuilds_it(versions,
                                                                              tmp_path):
    out = tmp_path / "client"

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o")))
        url = await origin.start()
        await origin.publish(versions[0], 1, SHARD)
        m2 = await origin.publish(versions[1], 2, SHARD, delta_from=1)
        assert m2.payload == "delta"
        async with signed_client([url], FAST) as c:
            await c.fetch(out / "v1", 1)
            r = await c.fetch(out / "v2", 2, held=out)
        await origin.stop()
        return m2, r

    m2, r = run(main(), 60)
    assert (r.payload, r.fetched_bytes) == ("delta", m2.fetch_size)
    assert m2.fetch_size < 0.10 * m2.part_size(FULL_DIR)
    for p in versions[1].iterdir():
        assert sha256_file(out / "v2" / p.name) == sha256_file(p)
