# over 400 lines: the manifest format, its signature and every byte check of a version: one format,
#  one module
"""Shardcast manifests: what a version is made of, and how every byte of it is checked.

A version is one file or one directory of files (a checkpoint). Each file is cut into shards of
`shard_size` bytes (the last one shorter); shards are numbered across the files in manifest
order. The manifest lists every file (relative path, size, sha256 of the whole file) and every
shard (file, offset, size, the sha256 of each `piece_size` piece of the shard, and the shard's
sha256: the sha256 of its piece digests, so it commits to them). Hashes are sha256.

Receivers verify each piece before it is written anywhere; since the pieces cover every byte, a
version whose pieces all verify equals the published one. Pieces (1 MiB by default) rather than
whole shards are the unit of verification so that a receiver streams a shard through a few
cache-sized buffers (hash and write read cache-hot bytes; no shard-sized buffer to fault in)
instead of holding 50 MB per transfer, and hashes each byte once. Publishing hashes each byte
twice (its piece, and the whole file for tools outside shardcast such as `sha256sum` and the
optional `verify_files` pass).

A manifest comes from untrusted servers, so it is bounded (bytes, files, shards, names, sizes,
numbers) and carries the publisher's EIP-191 `signature` of (run, version, digest)
(`signing.py`); the digest (the version's identity) is the sha256 of the canonical JSON without
the signature. `run` names the run (a pool: `pool-<id>`) the version belongs to: a trainer key
that signs for several runs cannot have one run's version taken for another's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshrl.shardcast.adapter import ADAPTER_FILES
from meshrl.shardcast.errors import ShardcastError

__all__ = [
    "DELTA_DIR",
    "DELTA_SUFFIX",
    "FULL_DIR",
    "HASH_CHUNK",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "MAX_RUN_BYTES",
    "MAX_VERSION",
    "PIECE_SIZE",
    "RUN_PATTERN",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "Payload",
    "ShardEntry",
    "build_manifest",
    "sha256_file",
    "shard_sha256",
]

MANIFEST_NAME = "manifest.json"
HASH_CHUNK = 1 << 20  # stream files in 1 MiB reads
PIECE_SIZE = 1 << 20  # default bytes per verified piece
FORMAT = 5  # 3: signed by the publisher; 4: says its payload; 5: names its run
FULL_DIR, DELTA_DIR = "full", "delta"  # the two parts of a delta version
DELTA_SUFFIX = ".xorz"  # delta/<name>.xorz reconstructs full/<name> (delta.py)
_HEX = 64  # hex characters of one sha256 digest
_HEX_DIGITS = frozenset("0123456789abcdef")
_SHA256 = r"^[0-9a-f]{64}$"
# bounds of what a server may make a receiver parse, allocate or create
MAX_MANIFEST_BYTES = 64 << 20  # ~1M pieces of hex: a 1 TB checkpoint at 1 MiB pieces
MAX_VERSION = 2**63 - 1  # a version is a trainer step: int64, like the chain's
MAX_FILES = 100_000
MAX_SHARDS = 1 << 20
MAX_PIECE_SIZE = 1 << 26  # a receiver holds about one piece per shard worker in memory
MAX_SHARD_SIZE = 1 << 40
MAX_FILE_SIZE = 1 << 48
MAX_NAME_BYTES = 4096  # PATH_MAX
MAX_PART_BYTES = 255  # NAME_MAX
MAX_RUN_BYTES = 128
# a run id: one line of plain ASCII (it is a line of the signed text), '' only before signing
RUN_PATTERN = rf"^[0-9A-Za-z._:/@+-]{{0,{MAX_RUN_BYTES}}}$"  # pydantic's (Rust) `$`: text end


class ManifestError(ShardcastError, ValueError):
    """A manifest that is malformed or inconsistent with itself."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # `true` is no version


class FileEntry(_Frozen):
    name: str = Field(max_length=MAX_NAME_BYTES,
                      description="path relative to the version root, '/'-separated")
    size: int = Field(ge=0, le=MAX_FILE_SIZE)
    sha256: str = Field(pattern=_SHA256)


class ShardEntry(_Frozen):
    index: int = Field(ge=0, lt=MAX_SHARDS)
    file: int = Field(ge=0, lt=MAX_FILES, description="index into Manifest.files")
    offset: int = Field(ge=0, le=MAX_FILE_SIZE)
    size: int = Field(ge=0, le=MAX_SHARD_SIZE)
    sha256: str = Field(pattern=_SHA256)
    pieces: str = Field(description="sha256 hex of each piece of the shard, concatenated")

    def piece_digest(self, j: int) -> str:
        return self.pieces[j * _HEX : (j + 1) * _HEX]


Payload = Literal["full", "delta", "adapter"]


class Manifest(_Frozen):
    format: int = FORMAT
    run: str = Field("", pattern=RUN_PATTERN, description="the run (e.g. `pool-<id>`) the "
                     "version belongs to: signed with it, refused by every relay and client "
                     "of another run")
    version: int = Field(ge=0, le=MAX_VERSION, description="the trainer's step number")
    kind: Literal["file", "dir"]
    payload: Payload = Field("full", description="full: the files themselves; delta: "
                             "full/<files> and delta/<file>.xorz against version `base` (a "
                             "client holding the base fetches only delta/); adapter: LoRA "
                             "adapter files for the pool's base model")
    base: int | None = Field(None, ge=0, le=MAX_VERSION,
                             description="the version a delta is taken against, or an "
                             "adapter applies to (a full version)")
    base_digest: str | None = Field(None, pattern=_SHA256,
                                    description="the digest of the base version's manifest")
    shard_size: int = Field(gt=0, le=MAX_SHARD_SIZE)
    piece_size: int = Field(PIECE_SIZE, gt=0, le=MAX_PIECE_SIZE,
                            description="bytes per verified piece of a shard")
    files: tuple[FileEntry, ...] = Field(max_length=MAX_FILES)
    shards: tuple[ShardEntry, ...] = Field(max_length=MAX_SHARDS)
    created: float = Field(0.0, allow_inf_nan=False)
    signature: str = Field("", pattern=r"^(0x[0-9a-f]{130})?$", description="the publisher's "
                           "EIP-191 signature of (run, version, digest); '' before signing")

    def piece_count(self, shard: ShardEntry) -> int:
        return -(-shard.size // self.piece_size)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def part(self, prefix: str) -> list[int]:
        """Indices of the files under `prefix/` (a delta version's `full` or `delta`)."""
        return [i for i, f in enumerate(self.files) if f.name.startswith(prefix + "/")]

    def part_size(self, prefix: str) -> int:
        return sum(self.files[i].size for i in self.part(prefix))

    @property
    def fetch_size(self) -> int:
        """Bytes a client holding the base fetches: the delta part of a delta version, all of
        any other."""
        return self.part_size(DELTA_DIR) if self.payload == "delta" else self.total_size

    def to_json(self) -> bytes:
        """The canonical JSON, signature included (what stores keep and servers serve)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON without the signature: servers that agree on a version
        agree on this, and it is what the publisher signs."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_json(cls, data: bytes | str) -> Manifest:
        if len(data) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"shardcast: manifest of {len(data)} bytes is over "
                                f"{MAX_MANIFEST_BYTES}")
        try:
            m = cls.model_validate_json(data)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])[:80]
            raise ManifestError(f"shardcast: malformed manifest: {where}: {err['msg']}") from None
        m.check()
        return m

    def check(self) -> None:
        """Raise ManifestError unless the shards tile every file exactly, in order."""
        if self.format != FORMAT:
            raise ManifestError(f"shardcast: unsupported manifest format {self.format}")
        if self.kind == "file" and len(self.files) != 1:
            raise ManifestError("shardcast: a 'file' manifest must list exactly one file")
        names: set[str] = set()
        dirs: set[str] = set()
        for f in self.files:
            if not _good_name(f.name) or f.name in names:
                raise ManifestError(f"shardcast: bad or duplicate file name {f.name[:100]!r}")
            names.add(f.name)
            parts = f.name.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if names & dirs:  # "a" and "a/b": one would have to be a file and a directory
            raise ManifestError(f"shardcast: {sorted(names & dirs)[0][:100]!r} is a file and a "
                                "directory")
        cursor = {i: 0 for i in range(len(self.files))}
        for expect, s in enumerate(self.shards):
            if s.index != expect or s.file >= len(self.files):
                raise ManifestError(f"shardcast: shard {s.index} out of order or bad file")
            if s.offset != cursor[s.file] or s.size > self.shard_size:
                raise ManifestError(f"shardcast: shard {s.index} does not tile its file")
            cursor[s.file] += s.size
            if len(s.pieces) != _HEX * self.piece_count(s) or not _is_hex(s.pieces):
                raise ManifestError(f"shardcast: shard {s.index} has bad piece hashes")
            if hashlib.sha256(bytes.fromhex(s.pieces)).hexdigest() != s.sha256:
                raise ManifestError(f"shardcast: shard {s.index} sha256 is not its pieces' hash")
        for i, f in enumerate(self.files):
            if cursor[i] != f.size:
                raise ManifestError(f"shardcast: shards do not cover {f.name!r}")
        self._check_payload(names)

    def _check_payload(self, names: set[str]) -> None:
        """A delta names its base and holds one delta per full file, nothing else; an adapter
        names its base and holds the adapter's files, nothing else."""
        if self.payload == "full":
            if self.base is not None or self.base_digest is not None:
                raise ManifestError(f"shardcast: a {self.payload!r} version has no base")
            return
        if self.base is None or self.base_digest is None or self.base >= self.version:
            raise ManifestError(f"shardcast: a {self.payload} version needs an older base "
                                "version and its digest")
        if self.kind != "dir":
            raise ManifestError(f"shardcast: a {self.payload} version is a directory")
        if self.payload == "adapter":
            if names != set(ADAPTER_FILES):
                raise ManifestError("shardcast: an adapter version holds "
                                    f"{', '.join(ADAPTER_FILES)}, nothing else")
            return
        full = {n[len(FULL_DIR) + 1:] for n in names if n.startswith(FULL_DIR + "/")}
        deltas = {f"{DELTA_DIR}/{n}{DELTA_SUFFIX}" for n in full}
        if not full or names != deltas | {f"{FULL_DIR}/{n}" for n in full}:
            raise ManifestError("shardcast: a delta version holds full/<f> and delta/<f>.xorz "
                                "for the same files, nothing else")


def _good_name(name: str) -> bool:
    """A relative '/'-path every receiver can create under its root, and nothing else: no
    escape ('..', absolute), no empty or '.' parts, no control characters (NUL ends a C path),
    valid UTF-8, within PATH_MAX / NAME_MAX."""
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON can spell one)
        return False
    if not raw or len(raw) > MAX_NAME_BYTES or any(c < 32 or c == 127 for c in raw):
        return False
    parts = raw.split(b"/")
    return all(p not in (b"", b".", b"..") and len(p) <= MAX_PART_BYTES for p in parts)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def shard_sha256(data: bytes | memoryview, piece_size: int) -> str:
    """A shard's sha256 as the manifest has it: sha256 of its pieces' sha256 digests."""
    view = memoryview(data)
    digests = b"".join(hashlib.sha256(view[i : i + piece_size]).digest()
                       for i in range(0, len(view), piece_size))
    return hashlib.sha256(digests).hexdigest()


def _hash_file_shards(
    path: Path, shard_size: int, piece_size: int, copy_to: Path | None
) -> tuple[str, list[tuple[int, int, str, str]]]:
    """One pass over the file: whole-file sha256 and (offset, size, sha256, pieces) per shard.

    The file is read piece by piece into two reused buffers (so both hashes read cache-hot
    bytes), the whole-file hash running beside the piece hashes on a second core. With
    `copy_to`, the bytes hashed are also written there, so the copy is exactly what the
    manifest describes even if the source changes meanwhile.
    """
    whole = hashlib.sha256()
    shards: list[tuple[int, int, str, str]] = []
    # two buffers in turn: a helper thread feeds the whole-file hash with the previous piece
    # (hashlib releases the GIL) while this thread reads, hashes and copies the next one
    bufs = [memoryview(bytearray(min(piece_size, shard_size))) for _ in range(2)]
    in_use: list[Future | None] = [None, None]
    turn = 0
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="sha256-file"))
        f = stack.enter_context(open(path, "rb", buffering=0))
        out = stack.enter_context(open(copy_to, "xb", buffering=0)) if copy_to else None
        offset = 0
        while True:
            size, pieces = 0, []
            while size < shard_size:
                want = min(piece_size, shard_size - size)
                if (busy := in_use[turn]) is not None:
                    busy.result()  # the whole-file hash is done with this buffer
                buf = bufs[turn]
                n = _read_full(f, buf[:want])
                if not n:
                    break
                chunk = buf[:n]
                in_use[turn] = pool.submit(whole.update, chunk)  # one worker: in file order
                turn = 1 - turn
                pieces.append(hashlib.sha256(chunk).digest())
                if out is not None:
                    _write_full(out, chunk)
                size += n
                if n < want:
                    break  # end of file inside this shard
            if size == 0 and shards:
                break
            joined = b"".join(pieces)
            shards.append((offset, size, hashlib.sha256(joined).hexdigest(), joined.hex()))
            offset += size
            if size < shard_size:
                break
        for busy in in_use:
            if busy is not None:
                busy.result()
    return whole.hexdigest(), shards


def _read_full(f, view: memoryview) -> int:
    n = 0
    while n < len(view) and (got := f.readinto(view[n:])):
        n += got
    return n


def _write_full(f, view: memoryview) -> None:
    n = 0
    while n < len(view):
        n += f.write(view[n:])


def _is_hex(s: str) -> bool:
    return set(s) <= _HEX_DIGITS


def _try_link(src: Path, dest: Path) -> bool:
    try:
        os.link(src, dest)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    return True


def list_files(root: Path) -> list[Path]:
    """Files under `root` in a stable order (sorted relative paths); symlinks are followed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        out.extend(Path(dirpath, n) for n in sorted(filenames))
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def build_manifest(
    path: str | Path,
    version: int,
    shard_size: int,
    created: float = 0.0,
    copy_to: Path | None = None,
    link: bool = False,
    piece_size: int = PIECE_SIZE,
    payload: Payload = "full",
    base: Manifest | None = None,
    run: str = "",
) -> Manifest:
    """Hash `path` (a file, or a directory of files) into a manifest for `version` of `run`.

    With `copy_to` (a directory), each file is also copied to `copy_to/<name>` in the same pass,
    or hard-linked there with `link` (no copy; the source must then never be modified in place,
    which clients would detect as hash mismatches). Links fall back to copies across devices.
    A `payload` "delta" names `base` (the manifest of the version it is taken against).
    """
    path = Path(path)
    if path.is_file():
        kind, paths, names = "file", [path], [path.name]
    elif path.is_dir():
        kind, paths = "dir", list_files(path)
        names = [p.relative_to(path).as_posix() for p in paths]
    else:
        raise FileNotFoundError(f"shardcast: nothing to publish at {path}")
    files, shards = [], []
    for fi, (p, name) in enumerate(zip(paths, names, strict=True)):
        dest = None
        if copy_to is not None:
            dest = copy_to / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if link and _try_link(p, dest):
                p, dest = dest, None  # hash the linked file itself
        whole, parts = _hash_file_shards(p, shard_size, piece_size, dest)
        files.append(FileEntry(name=name, size=sum(x[1] for x in parts), sha256=whole))
        for offset, size, digest, pieces in parts:
            shards.append(ShardEntry(index=len(shards), file=fi, offset=offset, size=size,
                                     sha256=digest, pieces=pieces))
    m = Manifest(run=run, version=version, kind=kind, shard_size=shard_size, piece_size=piece_size,
                 files=tuple(files), shards=tuple(shards), created=created, payload=payload,
                 base=base.version if base is not None else None,
                 base_digest=base.digest if base is not None else None)
    m.check()
    return m
