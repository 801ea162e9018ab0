"""Durable writes: a file or directory is in place whole, or not at all, even after a crash or a
power cut.

The one recipe: write under a temporary name in the same directory, fsync the data, rename it
over the final name (atomic on POSIX), then fsync the directory, so that the rename itself is on
disk before the caller goes on (acknowledges an upload, records a phase, moves a cursor).
Temporary files are hidden and end in `.tmp` (`.<name>.<pid>.<random>.tmp`): a directory's
owner may delete `.*.tmp` left behind by a crash at start-up.

`sync=False` keeps the atomic rename but skips the fsyncs: for files that only other processes
read while the machine stays up (ready files, caches), where a crash of the process is the risk
and a power cut is not.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write", "fsync_dir", "fsync_tree", "replace"]


def atomic_write(path: str | Path, data: bytes | str, sync: bool = True) -> None:
    """Write `data` (str: UTF-8) to `path`: afterwards `path` holds the old bytes or the new."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        replace(tmp, path, sync)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace(src: str | Path, dst: str | Path, sync: bool = True) -> None:
    """Rename `src` over `dst` (a complete file or directory, its data already synced) and make
    the rename durable: fsync the directory of `dst` (and of `src`, when it is another)."""
    src, dst = Path(src), Path(dst)
    os.replace(src, dst)
    if sync:
        fsync_dir(dst.parent)
        if src.parent.resolve() != dst.parent.resolve():
            fsync_dir(src.parent)


def fsync_dir(directory: str | Path) -> None:
    """fsync a directory: the names created, renamed or removed in it are on disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under `root` (symlinks are not followed), `root` last:
    a directory written in full, about to be renamed into place."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                fsync_dir(p)
    fsync_dir(root)
