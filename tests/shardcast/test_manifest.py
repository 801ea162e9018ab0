import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.shardcast.manifest import (
    Manifest,
    ManifestError,
    build_manifest,
    sha256_file,
    shard_sha256,
)

from .conftest import make_file


@settings(max_examples=25, deadline=None)
@given(size=st.integers(0, 5000), shard_size=st.integers(1, 1200), piece=st.integers(1, 700))
def test_shards_tile_the_file_and_hash_it(tmp_path_factory, size, shard_size, piece):
    p = make_file(tmp_path_factory.mktemp("m") / "f.bin", size, seed=size)
    m = build_manifest(p, 3, shard_size, piece_size=piece)
    data = p.read_bytes()
    assert m.total_size == size and m.files[0].sha256 == sha256_file(p)
    import hashlib

    joined = b"".join(data[s.offset : s.offset + s.size] for s in m.shards)
    assert joined == data
    for s in m.shards:
        body = data[s.offset : s.offset + s.size]
        assert s.sha256 == shard_sha256(body, piece)
        pieces = [body[i : i + piece] for i in range(0, s.size, piece)]
        assert m.piece_count(s) == len(pieces)
        for j, b in enumerate(pieces):  # every byte is covered by a piece hash
            assert s.piece_digest(j) == hashlib.sha256(b).hexdigest()
    assert Manifest.from_json(m.to_json()) == m
    assert len(m.shards) == max(1, -(-size // shard_size))


def test_directory_manifest_is_sorted_and_roundtrips(tmp_path):
    make_file(tmp_path / "ck" / "model.safetensors", 3000, 1)
    make_file(tmp_path / "ck" / "config.json", 10, 2)
    make_file(tmp_path / "ck" / "sub" / "a.bin", 0, 3)
    m = build_manifest(tmp_path / "ck", 7, 1024)
    assert m.kind == "dir"
    assert [f.name for f in m.files] == ["config.json", "model.safetensors", "sub/a.bin"]
    again = Manifest.from_json(m.to_json())
    assert again == m and again.digest == m.digest


def _tampered(m: Manifest, **change) -> bytes:
    data = json.loads(m.to_json())
    for key, value in change.items():
        path = key.split("__")
        node = data
        for p in path[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        node[path[-1]] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "change",
    [
        {"shards__1__offset": 5},  # gap
        {"shards__0__size": 2000},  # larger than shard_size
        {"files__0__size": 99},  # shards do not cover the file
        {"files__0__name": "../evil"},  # path escape
        {"shards__1__index": 7},
        {"format": 99},
        {"kind": "tarball"},
        {"piece_size": 512},  # piece hashes no longer match the pieces' count
        {"shards__0__pieces": "g" * 64},  # not hex
        {"shards__0__pieces": ""},
        {"shards__0__pieces": "0" * 64},  # no longer what the shard's sha256 commits to
        {"shards__0__sha256": "0" * 64},
        # what a receiver could not create, or would have to allocate without bound
        {"files__0__name": "model\x00.bin"},  # NUL ends a C path (os.open: ValueError)
        {"files__0__name": "a\nb"},
        {"files__0__name": "\ud800"},  # a lone surrogate: not UTF-8
        {"files__0__name": "x" * 256},  # past NAME_MAX
        {"files__0__name": "a/" * 2100 + "b"},  # past PATH_MAX
        {"files__0__name": "/etc/passwd"},
        {"files__0__name": "a/./b"},
        {"files__0__name": ""},
        {"files__0__name": 7},
        {"version": 2**63},
        {"version": -1},
        {"version": True},
        {"piece_size": 1 << 27},  # a piece is held in memory per shard worker
        {"created": "NaN"},
        {"signature": "0xzz"},
        {"files__0__sha256": "A" * 64},
    ],
)
def test_inconsistent_manifests_are_rejected(tmp_path, change):
    m = build_manifest(make_file(tmp_path / "f", 3000, 4), 1, 1024)
    with pytest.raises(ManifestError):
        Manifest.from_json(_tampered(m, **change))


def test_garbage_is_rejected():
    with pytest.raises(ManifestError):
        Manifest.from_json(b"{not json")


def test_a_name_that_is_a_file_and_a_directory_is_rejected(tmp_path):
    make_file(tmp_path / "ck" / "a" / "b", 10, 1)
    make_file(tmp_path / "ck" / "c", 10, 2)
    m = build_manifest(tmp_path / "ck", 1, 1024)
    with pytest.raises(ManifestError, match="is a file and a directory"):
        Manifest.from_json(_tampered(m, files__1__name="a"))


def test_manifest_errors_are_shardcast_errors_and_the_size_is_bounded():
    from meshrl.shardcast import ShardcastError
    from meshrl.shardcast.manifest import MAX_MANIFEST_BYTES

    with pytest.raises(ShardcastError, match="over"):
        Manifest.from_json(b" " * (MAX_MANIFEST_BYTES + 1))


def test_the_digest_is_of_the_manifest_without_its_signature(tmp_path):
    from meshrl.shardcast import sign_manifest

    m = build_manifest(make_file(tmp_path / "f", 3000, 4), 1, 1024, run="pool-1")
    signed = sign_manifest(m, "0x" + "5c" * 32)
    assert signed.signature and signed.digest == m.digest and signed.to_json() != m.to_json()
    assert Manifest.from_json(signed.to_json()) == signed
