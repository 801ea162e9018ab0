"""The 144-byte header every delta file starts with, whichever codec made it, and the checks a
client makes of it before inflating a byte:

    magic (10 bytes: the codec) + u64 target_size + u64 base_size + 32-byte base sha256
    + 32-byte target sha256 + 54 reserved zero bytes
"""

from __future__ import annotations

import hashlib
import struct

from meshrl.shardcast.errors import BaseMismatch, DeltaError, DeltaFault

__all__ = ["HEADER_SIZE", "check_header", "pack_header"]

_HEAD = struct.Struct("<10sQQ32s32s54x")
HEADER_SIZE = _HEAD.size  # 144


def pack_header(magic: bytes, target: bytes | memoryview, base: bytes | memoryview) -> bytes:
    return _HEAD.pack(magic, len(target), len(base), hashlib.sha256(base).digest(),
                      hashlib.sha256(target).digest())


def check_header(delta: bytes | memoryview, magics: tuple[bytes, ...],
                 base: bytes | memoryview, target_size: int, target_sha256: str) -> bytes:
    """The magic of `delta`, one of `magics`, once its header names the manifest's target
    (`target_size`, `target_sha256`) and `base` as its base (BaseMismatch otherwise)."""
    if len(delta) < HEADER_SIZE:
        raise DeltaError(DeltaFault.MALFORMED, "shardcast: delta shorter than its header")
    magic, size, base_size, base_sha, target_sha = _HEAD.unpack_from(delta)
    if magic not in magics:
        raise DeltaError(DeltaFault.MALFORMED, "shardcast: not a meshrl delta (bad magic)")
    if size != target_size or target_sha.hex() != target_sha256:
        raise DeltaError(DeltaFault.WRONG_TARGET,
                         "shardcast: delta is for another target than the manifest's")
    if base_size != len(base) or hashlib.sha256(base).digest() != base_sha:
        raise BaseMismatch("shardcast: the base held is not the delta's base")
    return bytes(magic)
