"""Where rollout files are stored: an interface, and the built-in disk store behind it.

The orchestrator grants upload slots; the store says where a slot's bytes go (`upload_target`)
and, for a store that receives bytes itself, receives them (`receive`). The disk store is the
first implementation: the upload comes to the orchestrator, which hashes and counts the bytes
while writing a temporary file and keeps it only if size and sha256 are the granted ones. An
S3-compatible store would return a pre-signed PUT URL from `upload_target` (with the sha256 as
its checksum condition) and verify the object in `confirm` instead of receiving bytes.

File names come from the validated sha256 only ("<2 hex>/<64 hex>.parquet"), never from
anything a client sends, so no request can name a path outside the store.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from meshrl.durable import replace
from meshrl.wire.errors import ErrorCode

__all__ = [
    "DiskFileStore", "FileStore", "StoreRefusal", "UploadTarget", "check_sha", "check_slot_id",
    "parquet_framed",
]

_SHA = re.compile(r"^[0-9a-f]{64}$")
_SLOT = re.compile(r"^[0-9a-f]{32}$")


class StoreRefusal(Exception):
    """Bytes the store will not keep (size or hash not as granted, bad name); `code` is the
    refusal the uploader or reader gets."""

    def __init__(self, code: ErrorCode, detail: str = "") -> None:
        super().__init__(f"{code.reason}: {detail}" if detail else code.reason)
        self.code, self.detail = code, detail


@dataclass(frozen=True)
class UploadTarget:
    method: str
    url: str
    signed: bool  # True: sign like any request to the orchestrator; False: a pre-signed URL


class FileStore(abc.ABC):
    """Rollout file storage keyed by sha256."""

    @abc.abstractmethod
    def upload_target(self, slot_id: str, sha256: str, size: int, base_url: str) -> UploadTarget:
        """Where the holder of slot `slot_id` sends the file."""

    @abc.abstractmethod
    async def receive(self, sha256: str, size: int, chunks: AsyncIterator[bytes]) -> None:
        """Store the streamed bytes if they are exactly `size` bytes hashing to `sha256`."""

    @abc.abstractmethod
    def exists(self, sha256: str) -> bool:
        """Whether the file is stored (complete and verified)."""

    @abc.abstractmethod
    def path(self, sha256: str) -> Path:
        """A local path to read the file from (disk store) or raise for remote stores."""


_MAGIC = b"PAR1"  # a Parquet file starts and ends with it; the footer's length precedes the end


async def parquet_framed(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    """`chunks`, refused (`NOT_A_ROLLOUT_FILE`) unless they are framed as a Parquet file: the
    magic first and last, a footer that fits. Cheap (no parsing), so random bytes are never
    stored as a rollout file; the validator's reader judges the rest."""
    head, tail = b"", b""
    async for chunk in chunks:
        if len(head) < 4:
            head += chunk[: 4 - len(head)]
            if len(head) == 4 and head != _MAGIC:
                raise StoreRefusal(ErrorCode.NOT_A_ROLLOUT_FILE, "no Parquet magic at the start")
        tail = (tail + chunk)[-8:]
        yield chunk
    footer = int.from_bytes(tail[:4], "little") if len(tail) == 8 else -1
    if head != _MAGIC or tail[4:] != _MAGIC or not 0 < footer <= size - 12:
        raise StoreRefusal(ErrorCode.NOT_A_ROLLOUT_FILE, "no Parquet footer at the end")


def check_slot_id(slot_id: str) -> str:
    if not _SLOT.match(slot_id):
        raise StoreRefusal(ErrorCode.BAD_SLOT_ID, "32 lower hex")
    return slot_id


def check_sha(sha256: str) -> str:
    if not _SHA.match(sha256):
        raise StoreRefusal(ErrorCode.BAD_FILE_NAME, "a file is named by its sha256 (64 lower hex)")
    return sha256


class DiskFileStore(FileStore):
    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root).resolve()
        self.fsync = fsync
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        for stale in (self.root / "tmp").iterdir():  # partial uploads of a killed process
            stale.unlink(missing_ok=True)

    def upload_target(self, slot_id: str, sha256: str, size: int, base_url: str) -> UploadTarget:
        return UploadTarget("PUT", f"{base_url}/uploads/{check_slot_id(slot_id)}", True)

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.root / sha256[:2] / f"{sha256}.parquet"

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    async def receive(self, sha256: str, size: int, chunks: AsyncIterator[bytes]) -> None:
        final = self.path(sha256)
        tmp = self.root / "tmp" / f"{sha256}.{os.urandom(6).hex()}"
        h, n = hashlib.sha256(), 0
        try:
            with tmp.open("wb") as f:
                async for chunk in chunks:
                    n += len(chunk)
                    if n > size:
                        raise StoreRefusal(ErrorCode.SIZE_MISMATCH,
                                           f"more than the granted {size} bytes")
                    h.update(chunk)
                    f.write(chunk)
                if n != size:
                    raise StoreRefusal(ErrorCode.SIZE_MISMATCH, f"{n} bytes, granted {size}")
                if h.hexdigest() != sha256:
                    raise StoreRefusal(ErrorCode.SHA256_MISMATCH,
                                       "bytes do not hash to the granted sha256")
                f.flush()
                if self.fsync:  # off the event loop: a 10 MB fsync can take tens of ms
                    await asyncio.to_thread(os.fsync, f.fileno())
            final.parent.mkdir(exist_ok=True)
            replace(tmp, final, self.fsync)
        finally:
            tmp.unlink(missing_ok=True)
