"""On-disk version store shared by origins and relays.

Layout under the store root (see docs/shardcast.md):

    v<N>/manifest.json        a complete version N: visible to clients
    v<N>/data/<file names>    the version's files, byte for byte as published
    v<N>.partial/...          a relay's mirror in progress (same layout; only verified shards
                              are ever served from it, and it is renamed to v<N> when complete)
    .tmp-<N>-<random>/        an origin publish in progress (invisible)
    .trash-<N>-<random>/      a pruned version being deleted

A version becomes visible only by the rename of a finished directory, so a reader never sees a
half-written version. Pruning keeps the newest `keep` versions; a version with open readers is
hidden at once but deleted only when its last reader is done.

A store holds the versions of one `run` (a pool's `pool-<id>`): `publish` names it in every
manifest it signs with the publisher's `key` (an origin store written by the trainer), and a
manifest of another run found on disk is never advertised. With `publisher` set (a relay), only
manifests signed by it for `run` are ever taken from disk.

`fsync` is off by default: a store is a cache of data that every consumer verifies shard by
shard, so bytes lost in a crash are detected (and refetched), never used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from meshrl.durable import fsync_dir, fsync_tree
from meshrl.shardcast.errors import ManifestRefused, ShardcastError
from meshrl.shardcast.manifest import (
    FULL_DIR,
    MANIFEST_NAME,
    PIECE_SIZE,
    Manifest,
    ManifestError,
    Payload,
    build_manifest,
    list_files,
    sha256_file,
)
from meshrl.shardcast.signing import check_run, sign_manifest, verify_manifest

__all__ = [
    "ShardWriter",
    "StoreError",
    "VersionStore",
    "file_paths",
    "place_output",
    "verify_files",
]


class StoreError(ShardcastError):
    """A store operation that cannot be done (version exists, unknown version...)."""


def file_paths(manifest: Manifest, base: Path) -> list[Path]:
    """Where each manifest file lives under `base` (for kind 'file', `base` may be the file)."""
    return [base / f.name for f in manifest.files]


class ShardWriter:
    """Writes verified shards into preallocated files at their offsets (os.pwrite, no buffering).

    Only ever called with verified bytes (pieces whose sha256 matched the manifest).
    """

    def __init__(self, manifest: Manifest, paths: list[Path],
                 only: list[int] | None = None) -> None:
        self.manifest = manifest
        self.paths = paths  # of every file; `only` (file indices): the ones written
        self.only = list(range(len(paths))) if only is None else only
        self._fds: dict[int, int] = {}

    def open(self) -> None:
        for i in self.only:
            path, entry = self.paths[i], self.manifest.files[i]
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            self._fds[i] = fd
            os.ftruncate(fd, entry.size)
            if entry.size:
                try:  # reserve the space now, so a full disk fails before the download
                    os.posix_fallocate(fd, 0, entry.size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise

    def write(self, index: int, data: bytes | bytearray | memoryview) -> None:
        self.write_at(index, 0, data)

    def write_at(self, index: int, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write verified bytes at byte `pos` of shard `index`."""
        shard = self.manifest.shards[index]
        if pos < 0 or pos + len(data) > shard.size:
            raise ValueError(f"shardcast: write beyond shard {index}")
        fd, view, done = self._fds[shard.file], memoryview(data), 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], shard.offset + pos + done)

    def close(self, sync: bool = True) -> None:
        fds, self._fds = list(self._fds.values()), {}
        try:
            if sync:
                for fd in fds:
                    os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)


@dataclass
class Partial:
    manifest: Manifest
    path: Path
    writer: ShardWriter
    have: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.time)


class VersionStore:
    """Complete versions (from disk), partial mirrors (in memory + disk), readers and pruning."""

    def __init__(self, root: str | Path, keep: int = 5, fsync: bool = False,
                 publisher: str | None = None, run: str | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep, self.fsync, self.publisher = keep, fsync, publisher
        self.run = run and check_run(run)
        if publisher is not None:  # a relay's store: it would believe another run's versions
            check_run(run)
        self.complete: dict[int, Manifest] = {}
        self.partial: dict[int, Partial] = {}
        self.readers: dict[int, int] = {}
        self.retiring: set[int] = set()
        for stale in self.root.glob("v*.partial"):
            shutil.rmtree(stale, ignore_errors=True)  # a relay restarts its mirrors from scratch
        self.scan()

    # ---- naming -------------------------------------------------------------------------
    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version}"

    @staticmethod
    def _parse(name: str) -> int | None:
        if name.startswith("v") and name[1:].isascii() and name[1:].isdigit():
            return int(name[1:])
        return None

    # ---- reading ------------------------------------------------------------------------
    def scan(self) -> bool:
        """Pick up versions published by another process; prune. True when something changed."""
        found: dict[int, Manifest] = {}
        for entry in os.scandir(self.root):
            v = self._parse(entry.name)
            if v is None or v in self.retiring:
                continue
            if v in self.complete:
                found[v] = self.complete[v]
                continue
            try:
                m = Manifest.from_json((Path(entry.path) / MANIFEST_NAME).read_bytes())
                if self.publisher is not None:
                    verify_manifest(m, self.publisher, v, run=check_run(self.run))
                elif self.run is not None and m.run != self.run:
                    continue  # another run's version left in this directory
            except (OSError, ManifestError, ManifestRefused):
                continue  # not ours, damaged, or not the publisher's: never advertised
            found[v] = m
        changed = found.keys() != self.complete.keys()
        self.complete = found
        return self.prune() or changed

    def latest(self) -> int | None:
        known = list(self.complete) + list(self.partial)
        return max(known) if known else None

    def manifest(self, version: int) -> Manifest | None:
        if version in self.complete:
            return self.complete[version]
        p = self.partial.get(version)
        return p.manifest if p else None

    def has_shard(self, version: int, index: int) -> bool:
        if version in self.complete:
            return 0 <= index < len(self.complete[version].shards)
        p = self.partial.get(version)
        return p is not None and index in p.have

    @contextlib.contextmanager
    def reading(self, version: int) -> Iterator[None]:
        """Keep `version` on disk (not pruned) while the block runs."""
        self.readers[version] = self.readers.get(version, 0) + 1
        try:
            yield
        finally:
            self.readers[version] -= 1
            if self.readers[version] == 0:
                del self.readers[version]
                if version in self.retiring:
                    self._delete(version)

    @contextlib.contextmanager
    def open_shard(self, version: int, index: int) -> Iterator[tuple[int, int, int]]:
        """(fd, offset, size) of a servable shard; the version is not deleted while it is open.

        Opening happens synchronously, so a concurrent commit (rename) cannot race it.
        """
        if not self.has_shard(version, index):
            raise StoreError(f"shardcast: version {version} shard {index} not available")
        m = self.manifest(version)
        assert m is not None
        shard = m.shards[index]
        base = self.version_dir(version) if version in self.complete else self.partial[version].path
        path = file_paths(m, base / "data")[shard.file]
        fd = os.open(path, os.O_RDONLY)
        self.readers[version] = self.readers.get(version, 0) + 1
        try:
            yield fd, shard.offset, shard.size
        finally:
            os.close(fd)
            self.readers[version] -= 1
            if self.readers[version] == 0:
                del self.readers[version]
                if version in self.retiring:
                    self._delete(version)

    def full_dir(self, version: int) -> Path | None:
        """Where the full files of complete `version` lie (a delta version's `full/` part);
        None for a version not held or an adapter."""
        m = self.complete.get(version)
        if m is None or m.payload == "adapter":
            return None
        data = self.version_dir(version) / "data"
        return data / FULL_DIR if m.payload == "delta" else data

    # ---- origin: atomic publish ---------------------------------------------------------
    def publish(
        self, src: str | Path, version: int, shard_size: int, link: bool = False,
        piece_size: int = PIECE_SIZE, key: str | bytes | None = None,
        payload: Payload = "full", base: Manifest | None = None,
    ) -> Manifest:
        """Copy (or hard-link) + hash `src` into a hidden directory, sign its manifest (naming
        the store's run) with the publisher's `key`, then rename it into place. Without a key
        the manifest is unsigned: no relay or client believes it (tests of exactly that only);
        with a key but no run, RunRequired (no relay or client would believe it either)."""
        if key is not None:
            check_run(self.run)
        if self.version_dir(version).exists() or version in self.partial:
            raise StoreError(f"shardcast: version {version} already exists in {self.root}")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=self.root))
        try:
            m = build_manifest(src, version, shard_size, time.time(), tmp / "data", link,
                               piece_size, payload, base, self.run or "")
            if key is not None:
                m = sign_manifest(m, key)
            (tmp / MANIFEST_NAME).write_bytes(m.to_json())
            if self.fsync:
                fsync_tree(tmp)
            os.rename(tmp, self.version_dir(version))  # fails if it appeared meanwhile
            if self.fsync:
                fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.complete[version] = m
        self.prune()
        return m

    def publish_delta(
        self, src: str | Path, version: int, base: int, shard_size: int,
        piece_size: int = PIECE_SIZE, key: str | bytes | None = None,
    ) -> Manifest:
        """Publish model directory `src` as a delta version against complete version `base`
        (full/ and delta/ parts, docs/shardcast.md); a full version if `base` is not held or
        the delta part would not be smaller than the checkpoint (no client would gain)."""
        base_dir, base_m = self.full_dir(base), self.complete.get(base)
        if base_dir is None or base_m is None:
            return self.publish(src, version, shard_size, True, piece_size, key)
        from meshrl.shardcast.delta import make_delta_dir

        stage = Path(tempfile.mkdtemp(prefix=f".delta-{version}-", dir=self.root))
        try:
            with self.reading(base):
                delta = make_delta_dir(Path(src), base_dir, stage)
            if delta >= sum(p.stat().st_size for p in list_files(Path(src))):
                return self.publish(src, version, shard_size, True, piece_size, key)
            return self.publish(stage, version, shard_size, True, piece_size, key, "delta",
                                base_m)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def publish_adapter(
        self, src: str | Path, version: int, base: int, shard_size: int,
        piece_size: int = PIECE_SIZE, key: str | bytes | None = None,
    ) -> Manifest:
        """Publish the adapter directory `src` (shardcast/adapter.py's three files) as an
        adapter version for complete full version `base`, which is then kept while it is."""
        base_m = self.complete.get(base)
        if base_m is None or base_m.payload != "full":
            raise StoreError(f"shardcast: adapter version {version} needs full version {base} "
                             f"in {self.root}")
        return self.publish(src, version, shard_size, False, piece_size, key, "adapter", base_m)

    # ---- relay: pipelined mirror --------------------------------------------------------
    def begin_partial(self, manifest: Manifest) -> Partial:
        v = manifest.version
        if v in self.complete or v in self.partial:
            raise StoreError(f"shardcast: version {v} already held")
        path = self.root / f"v{v}.partial"
        shutil.rmtree(path, ignore_errors=True)
        writer = ShardWriter(manifest, file_paths(manifest, path / "data"))
        writer.open()
        (path / MANIFEST_NAME).write_bytes(manifest.to_json())
        self.partial[v] = p = Partial(manifest, path, writer)
        return p

    def commit_partial(self, version: int) -> None:
        p = self.partial[version]
        if len(p.have) != len(p.manifest.shards):
            raise StoreError(f"shardcast: version {version} is missing shards")
        p.writer.close(sync=self.fsync)  # no-op when the caller already closed it
        os.rename(p.path, self.version_dir(version))
        if self.fsync:
            fsync_dir(self.root)
        del self.partial[version]
        self.complete[version] = p.manifest
        self.prune()

    def abort_partial(self, version: int) -> None:
        p = self.partial.pop(version, None)
        if p is not None:
            p.writer.close(sync=False)
            shutil.rmtree(p.path, ignore_errors=True)

    # ---- pruning ------------------------------------------------------------------------
    def prune(self) -> bool:
        """Keep the newest `keep` complete versions, and the base of every adapter version
        kept (no client could use the adapter without it); hide older ones, delete them when
        unread."""
        newest = sorted(self.complete)[max(0, len(self.complete) - self.keep):]
        kept = [self.complete[v] for v in newest] + [p.manifest for p in self.partial.values()]
        bases = {m.base for m in kept if m.payload == "adapter"}
        old = [v for v in sorted(self.complete) if v not in newest and v not in bases]
        for v in old:
            del self.complete[v]
            self.retiring.add(v)
            if not self.readers.get(v):
                self._delete(v)
        return bool(old)

    def _delete(self, version: int) -> None:
        src = self.version_dir(version)
        trash = self.root / f".trash-{version}-{os.getpid()}-{time.monotonic_ns()}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(src, trash)  # invisible at once, even to other processes
            shutil.rmtree(trash, ignore_errors=True)
        self.retiring.discard(version)


def verify_files(m: Manifest, paths: list[Path], only: list[int] | None = None) -> None:
    entries = m.files if only is None else [m.files[i] for i in only]
    for entry, path in zip(entries, paths, strict=True):
        if sha256_file(path) != entry.sha256:
            raise StoreError(f"shardcast: {entry.name} does not match its sha256")


def place_output(tmp: Path, out: Path) -> None:
    """Move the finished `tmp` to `out`; an existing `out` is replaced only now."""
    if tmp.is_dir() and out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    else:
        os.replace(tmp, out)
