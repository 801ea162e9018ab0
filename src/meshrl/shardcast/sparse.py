"""Sparse value deltas of bfloat16 safetensors checkpoints (issue #40).

A trainer publishing bfloat16 versions of float32 master weights changes a 16-bit value only
when an update carries the weight across a rounding boundary: at RL learning rates most values
of a version equal the previous version's. Such a delta stores, for each tensor, the positions
whose 16-bit pattern changed and their new 16-bit patterns: values, not differences, so the
rebuild is exact by construction (NaN payloads and signed zeros included).

It applies only when both files are safetensors whose tensors are all BF16 and tile the data
region, and the target's header (8-byte length + JSON) is byte-identical to the base's (same
names, shapes, dtypes, offsets); anything else takes the file-level codec of `delta.py`.

A sparse delta file (`.xorz`, like every delta) is the 144-byte header of `deltahead.py` with
magic `MRLBF16V1\\n`, then one zstd frame of:

    table    per tensor in data-offset order: u8 mode + u64 count (little-endian, 9 bytes);
             mode 0: unchanged (count 0), 1: positions as gaps, 2: positions as a bitmap
    gaps     the mode-1 tensors' u32 gaps, concatenated, as 4 byte planes: position i is
             gap_0 + ... + gap_i - 1, so every gap >= 1 (positions strictly increasing)
    bitmaps  the mode-2 tensors' bitmaps (ceil(n / 8) bytes each, bit k of byte j = position
             8j + k, the bits past n zero)
    values   every changed position's new u16 value, concatenated, as 2 byte planes

The encoder picks gaps or a bitmap per tensor, whichever is smaller before compression (4 bytes
per change against n / 8). `decode` treats every byte as hostile: the layout comes from the base
(which `deltahead.check_header` has matched to the delta's sha256), every count is bounded by its
tensor's size before a byte past the table is inflated, the frame is inflated at most one byte
past what the counts imply (`OVERSIZED`, `TRUNCATED`), positions must be strictly increasing and
in range and bitmaps must agree with their counts, and the result must hash to the signed
manifest's sha256: a forged delta can only fail with a `DeltaError`, never yield other weights.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
from typing import BinaryIO

import numpy as np
import zstandard

from meshrl.shardcast.deltahead import HEADER_SIZE, pack_header
from meshrl.shardcast.errors import DeltaError, DeltaFault

__all__ = ["MAGIC", "bf16_layout", "decode", "encode"]

MAGIC = b"MRLBF16V1\n"
ENTRY = np.dtype([("mode", "u1"), ("count", "<u8")])  # 9 bytes, no padding
UNCHANGED, GAPS, BITMAP = 0, 1, 2
_MAX_HEADER = 100 << 20  # safetensors' own bound on its JSON header

Layout = tuple[int, list[tuple[int, int]]]  # (data start, [(word offset, words)] per tensor)


def bf16_layout(data: bytes | memoryview) -> Layout | None:
    """Where the tensors of safetensors bytes `data` lie, when every tensor is BF16 and together
    they tile the data region exactly; None for anything else."""
    if len(data) < 8:
        return None
    (n,) = struct.unpack_from("<Q", data)
    if n > min(_MAX_HEADER, len(data) - 8):
        return None
    try:
        head = json.loads(bytes(data[8:8 + n]))
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(head, dict):
        return None
    spans: list[tuple[int, int]] = []
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or t.get("dtype") != "BF16":
            return None
        shape, offs = t.get("shape"), t.get("data_offsets")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            return None
        if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int
                                                                    for o in offs):
            return None
        if offs[1] - offs[0] != 2 * math.prod(shape):
            return None
        spans.append((offs[0], offs[1]))
    start, at, out = 8 + n, 0, []
    for b, e in sorted(spans):
        if b != at:  # a hole or an overlap
            return None
        out.append((b // 2, (e - b) // 2))
        at = e
    return (start, out) if start + at == len(data) else None


def _planes(a: np.ndarray) -> bytes:
    """Little-endian words regrouped by byte plane: the high bytes of values and gaps are
    near-constant, and zstd sees them together."""
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.itemsize).T).tobytes()


def _unplanes(raw: bytes | memoryview, dtype: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    b = np.frombuffer(raw, dtype=np.uint8).reshape(size, -1)
    return np.ascontiguousarray(b.T).view(dtype).reshape(-1)


def encode(target: bytes | memoryview, base: bytes | memoryview, level: int = 3
           ) -> bytes | None:
    """The sparse delta turning `base` into `target`, or None when they are not two bfloat16
    safetensors files with one header (the caller takes the file-level codec)."""
    layout = bf16_layout(target)
    if layout is None or len(target) != len(base):
        return None
    start, spans = layout
    if bytes(target[:start]) != bytes(base[:start]):
        return None
    tw = np.frombuffer(target, dtype="<u2", offset=start)
    bw = np.frombuffer(base, dtype="<u2", offset=start)
    table = np.zeros(len(spans), ENTRY)
    gaps: list[np.ndarray] = []
    bitmaps: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for i, (w0, n) in enumerate(spans):
        changed = tw[w0:w0 + n] != bw[w0:w0 + n]
        pos = np.flatnonzero(changed)
        if not len(pos):
            continue
        values.append(tw[w0:w0 + n][pos])
        if 4 * len(pos) < (n + 7) // 8 and n < 1 << 32:  # a gap is at most n
            table[i] = (GAPS, len(pos))
            gaps.append(np.diff(pos, prepend=-1).astype("<u4"))
        else:
            table[i] = (BITMAP, len(pos))
            bitmaps.append(np.packbits(changed, bitorder="little"))
    body = b"".join([
        table.tobytes(),
        _planes(np.concatenate(gaps)) if gaps else b"",
        b"".join(m.tobytes() for m in bitmaps),
        _planes(np.concatenate(values)) if values else b"",
    ])
    return pack_header(MAGIC, target, base) + zstandard.ZstdCompressor(
        level=level, threads=0).compress(body)


def _read(r: BinaryIO, k: int) -> bytes:
    """Up to `k` bytes of `r` (fewer only at its end)."""
    parts, got = [], 0
    while got < k:
        b = r.read(k - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _fail(reason: DeltaFault, what: str) -> DeltaError:
    return DeltaError(reason, f"shardcast: sparse delta: {what}")


def decode(delta: bytes | memoryview, base: bytes | memoryview, target_sha256: str) -> bytes:
    """The target of sparse `delta` on `base`; its header already checked
    (`deltahead.check_header`: the manifest's target, this base). DeltaError otherwise."""
    layout = bf16_layout(base)
    if layout is None:
        raise _fail(DeltaFault.MALFORMED, "the base is not a bfloat16 safetensors file")
    start, spans = layout
    n = np.array([w for _, w in spans], dtype=np.uint64)
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(delta[HEADER_SIZE:])) as r:
            raw = _read(r, len(spans) * ENTRY.itemsize)
            if len(raw) != len(spans) * ENTRY.itemsize:
                raise _fail(DeltaFault.TRUNCATED, "its table ends early")
            table = np.frombuffer(raw, ENTRY)
            modes, counts = table["mode"], table["count"]
            if (modes > BITMAP).any():
                raise _fail(DeltaFault.MALFORMED, "an unknown position mode")
            if (counts > n).any() or ((modes == UNCHANGED) != (counts == 0)).any():
                raise _fail(DeltaFault.BAD_COUNTS, "a count over its tensor's size")
            n_gaps = int(counts[modes == GAPS].sum())
            n_bits = int(((n[modes == BITMAP] + np.uint64(7)) // np.uint64(8)).sum())
            n_values = int(counts.sum())
            want = 4 * n_gaps + n_bits + 2 * n_values  # bounded: <= 6.1 x the target size
            body = _read(r, want + 1)
    except zstandard.ZstdError as e:
        raise _fail(DeltaFault.UNDECODABLE, f"does not decompress: {e}") from None
    if len(body) != want:
        raise _fail(DeltaFault.OVERSIZED if len(body) > want else DeltaFault.TRUNCATED,
                    f"decompresses to {len(body)} bytes past its table, its counts say {want}")
    gaps = _unplanes(body[:4 * n_gaps], "<u4")
    bits = memoryview(body)[4 * n_gaps:4 * n_gaps + n_bits]
    values = _unplanes(body[4 * n_gaps + n_bits:], "<u2")
    out = bytearray(base)
    ow = np.frombuffer(out, dtype="<u2", offset=start)
    g = b = v = 0
    for (w0, size), mode, count in zip(spans, modes.tolist(), counts.tolist(), strict=True):
        if mode == GAPS:
            step = gaps[g:g + count].astype(np.int64)
            g += count
            if (step == 0).any():
                raise _fail(DeltaFault.BAD_POSITIONS, "positions not strictly increasing")
            pos = np.cumsum(step) - 1
            if pos[-1] >= size:
                raise _fail(DeltaFault.BAD_POSITIONS, "a position past its tensor's end")
        elif mode == BITMAP:
            nb = (size + 7) // 8
            mask = np.unpackbits(np.frombuffer(bits[b:b + nb], np.uint8), bitorder="little")
            b += nb
            if mask[size:].any():
                raise _fail(DeltaFault.BAD_POSITIONS, "a bitmap bit past its tensor's end")
            pos = np.flatnonzero(mask)
            if len(pos) != count:
                raise _fail(DeltaFault.BAD_COUNTS, "a count its bitmap belies")
        else:
            continue
        ow[w0 + pos] = values[v:v + count]
        v += count
    del ow  # release the export of `out`
    if hashlib.sha256(out).hexdigest() != target_sha256:
        raise _fail(DeltaFault.HASH_MISMATCH,
                    "reconstructed bytes do not match the manifest's sha256")
    return bytes(out)
