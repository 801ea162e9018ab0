import os

import pytest

from meshrl.shardcast.manifest import build_manifest
from meshrl.shardcast.store import StoreError, VersionStore

from .conftest import RUN, make_file


def test_publish_is_atomic_and_versions_are_found_by_another_store(tmp_path):
    src = make_file(tmp_path / "w.bin", 10_000, 1)
    store = VersionStore(tmp_path / "o", run=RUN, keep=5)
    m = store.publish(src, 4, 4096)
    assert (tmp_path / "o" / "v4" / "data" / "w.bin").read_bytes() == src.read_bytes()
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["v4"]  # no temporary left
    other = VersionStore(tmp_path / "o", run=RUN)  # e.g. the origin server re-scanning
    assert other.complete == {4: m}
    with pytest.raises(StoreError):
        store.publish(src, 4, 4096)


def test_failed_publish_leaves_nothing_visible(tmp_path):
    ck = tmp_path / "ck"
    make_file(ck / "a.bin", 5000, 1)
    os.symlink(tmp_path / "missing", ck / "b.bin")  # fails after a.bin was copied
    store = VersionStore(tmp_path / "o", run=RUN)
    with pytest.raises(FileNotFoundError):
        store.publish(ck, 1, 1024)
    assert list((tmp_path / "o").iterdir()) == []
    assert store.scan() is False and store.complete == {}


def test_prune_keeps_newest_and_waits_for_readers(tmp_path):
    src = make_file(tmp_path / "w.bin", 3000, 2)
    store = VersionStore(tmp_path / "o", run=RUN, keep=2)
    store.publish(src, 1, 1024)
    with store.open_shard(1, 2) as (fd, offset, size):
        store.publish(src, 2, 1024)
        store.publish(src, 3, 1024)
        assert sorted(store.complete) == [2, 3]  # v1 hidden at once...
        assert not store.has_shard(1, 0)
        assert (tmp_path / "o" / "v1").exists()  # ...but kept while being read
        assert os.pread(fd, size, offset) == src.read_bytes()[offset : offset + size]
    assert not (tmp_path / "o" / "v1").exists()
    store.publish(src, 4, 1024)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["v3", "v4"]


def test_partial_mirror_serves_only_marked_shards_then_commits(tmp_path):
    src = make_file(tmp_path / "w.bin", 3000, 3)
    m = build_manifest(src, 9, 1024, run=RUN)
    store = VersionStore(tmp_path / "r", run=RUN)
    p = store.begin_partial(m)
    assert store.latest() == 9 and not store.has_shard(9, 1)
    data = src.read_bytes()
    for s in m.shards:
        p.writer.write(s.index, data[s.offset : s.offset + s.size])
        p.have.add(s.index)
        assert store.has_shard(9, s.index)
    with pytest.raises(StoreError):
        store.begin_partial(m)
    store.commit_partial(9)
    assert (tmp_path / "r" / "v9" / "data" / "w.bin").read_bytes() == data
    assert VersionStore(tmp_path / "r", run=RUN).complete.keys() == {9}


def test_incomplete_mirror_cannot_commit_and_is_dropped_on_restart(tmp_path):
    m = build_manifest(make_file(tmp_path / "w.bin", 3000, 3), 2, 1024, run=RUN)
    store = VersionStore(tmp_path / "r", run=RUN)
    store.begin_partial(m)
    with pytest.raises(StoreError):
        store.commit_partial(2)
    restarted = VersionStore(tmp_path / "r", run=RUN)
    assert restarted.latest() is None and list((tmp_path / "r").iterdir()) == []
