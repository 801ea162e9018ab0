"""Lossless deltas between two versions of a file: what a client that holds version N-1 fetches
instead of the whole of version N.

A delta is, per 32-bit word, the zigzag-coded difference `target - base` of the two words read
as int32 (modulo 2^32, so exactly invertible; the base zero-padded or cut to the target's
length), its bytes regrouped into 4 byte planes (byte 0 of every word, then byte 1, ...) and
compressed with zstandard. On a safetensors checkpoint whose tensors keep their names and shapes
the headers are equal (their words difference to zeros) and every float32 weight is diffed with
its previous bit pattern: a small update changes only the low mantissa bits, so the difference
is a small integer, zigzag makes it small and positive whatever its sign, and the high byte
planes are almost all zeros. An XOR of the bit patterns does the same job less well: a carry
into a higher mantissa bit flips every bit below it (on the 25M preset, one Adam step at
lr 6e-5: 58% of the bytes with XOR, 44% with the zigzag difference). Nothing depends on the
file being safetensors: the delta is bit-exact for any pair of files.

A delta file (`.xorz`) is a fixed 144-byte header (`deltahead.py`), then the zstd frame:

    b"MRLDELTA1\\n" + u64 target_size + u64 base_size + 32-byte base sha256 + 32-byte target
    sha256 + 54 reserved zero bytes

Two bfloat16 safetensors files with one header take the sparse value codec of `sparse.py`
instead (magic `MRLBF16V1\\n`, same header): `encode_delta` picks it, `decode_delta` reads the
magic.

`apply_delta` treats every byte as hostile: the header must be exact, the base on disk must be
the one the delta was made from (`BaseMismatch`: the caller falls back to the full file), the
decompressed size is bounded by the target size the signed manifest states before any byte is
allocated, and the result must hash to the manifest's sha256 (`DeltaError`), so a corrupted or
forged delta can only fail, never yield other weights.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path

import numpy as np
import zstandard

from meshrl.shardcast import sparse
from meshrl.shardcast.deltahead import HEADER_SIZE, check_header, pack_header
from meshrl.shardcast.errors import BaseMismatch, DeltaError, DeltaFault
from meshrl.shardcast.manifest import DELTA_DIR, DELTA_SUFFIX, FULL_DIR, Manifest, list_files

__all__ = [
    "DELTA_SUFFIX",
    "BaseMismatch",
    "DeltaError",
    "DeltaFault",
    "apply_delta",
    "decode_delta",
    "encode_delta",
    "encode_words",
    "make_delta",
    "make_delta_dir",
    "reconstruct",
]

MAGIC = b"MRLDELTA1\n"
_WORD = 4  # float32: 4 byte planes
LEVEL = 3  # zstd level: fast on both ends; higher levels gain little on mantissa noise


def _pad(data: bytes | memoryview, size: int) -> np.ndarray:
    """`data` as uint8, zero-padded or cut to `size` bytes rounded up to whole words."""
    words = -(-size // _WORD) * _WORD
    out = np.zeros(words, dtype=np.uint8)
    n = min(len(data), size)
    out[:n] = np.frombuffer(data, dtype=np.uint8, count=n)
    return out


def _diff_planes(target: np.ndarray, base: np.ndarray) -> np.ndarray:
    """zigzag(int32(target) - int32(base)) per word, regrouped by byte plane (a transpose of
    the (words, 4) byte matrix)."""
    d = target.view(np.int32) - base.view(np.int32)  # wraps modulo 2^32: exactly invertible
    z = (d << 1) ^ (d >> 31)  # zigzag: small of either sign -> small unsigned
    return np.ascontiguousarray(z.view(np.uint8).reshape(-1, _WORD).T)


def _undiff(planes: np.ndarray, base: np.ndarray) -> np.ndarray:
    """The target words from their byte planes and the base (inverse of `_diff_planes`)."""
    z = np.ascontiguousarray(planes.reshape(_WORD, -1).T).view(np.uint32).reshape(-1)
    d = (z >> np.uint32(1)).view(np.int32) ^ -(z & np.uint32(1)).view(np.int32)
    return (base.view(np.int32) + d).view(np.uint8)


def encode_delta(target: bytes | memoryview, base: bytes | memoryview,
                 level: int = LEVEL) -> bytes:
    """The delta that turns `base` into `target` (header + zstd frame): the sparse value
    codec of `sparse.py` for two bfloat16 safetensors files with one header, else the
    file-level word difference. A sparse delta over a tenth of the target (many values
    changed: a large step) is compared with the file-level one and the smaller kept: the
    word difference of a value moved by one unit costs fewer bits than the new value."""
    d = sparse.encode(target, base, level)
    if d is not None and len(d) <= len(target) // 10:
        return d
    w = encode_words(target, base, level)
    return d if d is not None and len(d) <= len(w) else w


def encode_words(target: bytes | memoryview, base: bytes | memoryview,
                 level: int = LEVEL) -> bytes:
    """The file-level delta (module docstring), for any pair of files."""
    size = len(target)
    planes = _diff_planes(_pad(target, size), _pad(base, size))
    body = zstandard.ZstdCompressor(level=level, threads=0).compress(planes.tobytes())
    return pack_header(MAGIC, target, base) + body


def decode_delta(delta: bytes | memoryview, base: bytes | memoryview, target_size: int,
                 target_sha256: str) -> bytes:
    """`target` from `delta` and `base`, checked against the size and sha256 a signed manifest
    states (`target_size`, `target_sha256`): DeltaError for a bad delta, BaseMismatch when
    `base` is not the delta's base."""
    magic = check_header(delta, (MAGIC, sparse.MAGIC), base, target_size, target_sha256)
    if magic == sparse.MAGIC:
        return sparse.decode(delta, base, target_sha256)
    words = -(-target_size // _WORD) * _WORD
    try:  # bounded: never more than one byte past the target's size is inflated
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(delta[HEADER_SIZE:])) as r:
            planes = r.read(words + 1)
    except zstandard.ZstdError as e:
        raise DeltaError(DeltaFault.UNDECODABLE,
                         f"shardcast: delta does not decompress: {e}") from None
    if len(planes) != words:
        raise DeltaError(DeltaFault.OVERSIZED if len(planes) > words else DeltaFault.TRUNCATED,
                         f"shardcast: delta decompresses to {len(planes)} bytes, not {words}")
    flat = np.frombuffer(planes, dtype=np.uint8)
    out = _undiff(flat, _pad(base, target_size))[:target_size].tobytes()
    if hashlib.sha256(out).hexdigest() != target_sha256:
        raise DeltaError(DeltaFault.HASH_MISMATCH,
                         "shardcast: reconstructed bytes do not match the manifest's sha256")
    return out


def make_delta(target: Path, base: Path, out: Path, level: int = LEVEL) -> int:
    """Write the delta of file `target` against file `base` to `out`; its size in bytes."""
    data = encode_delta(target.read_bytes(), base.read_bytes(), level)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return len(data)


def apply_delta(delta: Path, base: Path, out: Path, target_size: int,
                target_sha256: str) -> None:
    """Reconstruct `out` from the files `delta` and `base` (see `decode_delta`)."""
    try:
        base_bytes = base.read_bytes()
    except FileNotFoundError:
        raise BaseMismatch(f"shardcast: no base file {base.name}") from None
    out.write_bytes(decode_delta(delta.read_bytes(), base_bytes, target_size, target_sha256))


def make_delta_dir(new: Path, base: Path, out: Path, level: int = LEVEL) -> int:
    """Lay out a delta version of model directory `new` against `base` under `out`:
    `full/<f>` (a hard link or copy of each file of `new`) and `delta/<f>.xorz` (against
    `base/<f>`; a file `base` lacks is diffed against nothing). The bytes of the delta part."""
    total = 0
    for path in list_files(new):
        rel = path.relative_to(new).as_posix()
        full = out / FULL_DIR / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, full)
        except OSError:
            shutil.copyfile(path, full)
        old = base / rel
        old_bytes = old.read_bytes() if old.is_file() else b""
        data = encode_delta(path.read_bytes(), old_bytes, level)
        dest = out / DELTA_DIR / f"{rel}{DELTA_SUFFIX}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        total += len(data)
    return total


def reconstruct(m: Manifest, fetched: Path, base: Path, out: Path) -> None:
    """Every full file of delta version `m` into `out`, from the delta part fetched under
    `fetched` and the base files under `base` (BaseMismatch, DeltaError: nothing usable)."""
    prefix = FULL_DIR + "/"
    for i in m.part(FULL_DIR):
        entry = m.files[i]
        rel = entry.name[len(prefix):]
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        apply_delta(fetched / DELTA_DIR / f"{rel}{DELTA_SUFFIX}", base / rel, dest,
                    entry.size, entry.sha256)
