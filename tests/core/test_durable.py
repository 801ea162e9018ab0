"""meshrl.durable: a writer killed at any moment leaves the old file or the new one, never a
mix, and its leftovers are hidden `.tmp` files its owner can sweep."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshrl.durable import atomic_write, fsync_dir, fsync_tree, replace

SRC = Path(__file__).resolve().parents[2] / "src"


def test_write_replace_and_no_leftovers(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    atomic_write(f, b"one")
    atomic_write(f, "two \u00e9")  # str: UTF-8
    assert f.read_bytes() == "two \u00e9".encode()
    atomic_write(f, b"three", sync=False)
    assert f.read_bytes() == b"three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    atomic_write(f, b"old")
    with pytest.raises(TypeError):
        atomic_write(f, 12345)  # type: ignore[arg-type]
    assert f.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_replace_moves_a_directory_into_another(tmp_path: Path) -> None:
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "a" / "deep" / "x").write_bytes(b"x")
    (tmp_path / "a" / "link").symlink_to("deep")  # not followed, not an error
    (tmp_path / "out").mkdir()
    fsync_tree(tmp_path / "a")
    replace(tmp_path / "a", tmp_path / "out" / "b")
    assert (tmp_path / "out" / "b" / "link" / "x").read_bytes() == b"x"
    assert not (tmp_path / "a").exists()
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "out" / "b" / "deep" / "x")


WRITER = """
import hashlib, sys
from meshrl.durable import atomic_write
path, i = sys.argv[1], 0
print("ready", flush=True)
while True:
    body = bytes([i % 251]) * (1 << 20)
    atomic_write(path, hashlib.sha256(body).digest() + body)
    i += 1
"""


def test_kill9_at_any_moment_leaves_a_whole_file(tmp_path: Path) -> None:
    f = tmp_path / "big.bin"
    atomic_write(f, hashlib.sha256(b"").digest())  # a valid file before the writer starts
    for delay in (0.0, 0.05, 0.13, 0.31):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(f)], stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(SRC)})
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(delay)  # where the kill lands; every landing must leave a whole file
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        data = f.read_bytes()
        assert hashlib.sha256(data[32:]).digest() == data[:32]
        left = [p.name for p in tmp_path.iterdir() if p != f]
        assert all(n.startswith(".big.bin.") and n.endswith(".tmp") for n in left), left
        for p in tmp_path.glob(".*.tmp"):  # what an owner sweeps at start-up
            p.unlink()
