"""Helpers for shardcast tests: real servers on 127.0.0.1 (ephemeral ports), small shards."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

SHARD = 64 * 1024
SRC_ROOT = Path(__file__).resolve().parents[2] / "src"


def run(coro, timeout: float = 30.0):
    """Run a test coroutine with a hard timeout (no pytest-asyncio needed)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def make_file(path: Path, size: int, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size) if seed < 0 else _det_bytes(size, seed))
    return path


def _det_bytes(size: int, seed: int) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


async def get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()


# Waiting for an event: poll a state the parts expose (a server's /health, a client's
# attributes) until it holds, never a fixed sleep (tests/shardcast/test_no_fixed_sleeps.py).
WAIT_S = 20.0  # s: generous for a loaded 2-core machine; a broken behaviour still fails
EVERY_S = 0.02  # s between looks


async def until(cond: Callable[[], Any | Awaitable[Any]], what: str,
                timeout: float = WAIT_S) -> Any:
    """`cond()`'s first truthy value (`cond` may be async), looking every 20 ms; an
    AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(EVERY_S)


async def held_polls(url: str) -> int:
    """Long polls the server at `url` holds now (its /health)."""
    return (await get_json(f"{url}/health"))["held_polls"]


async def streams_open(url: str) -> int:
    """Shard answers in progress at `url`, to relays and clients (its /health)."""
    return sum((await get_json(f"{url}/health"))["streams_open"].values())


def wait_until(cond: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """`until` for a test without an event loop (processes, threads)."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(EVERY_S)
    return value


def spawn_service(args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start `meshrl shardcast ...` in its own process; return it and the URL it bound."""
    env = {**os.environ, "PYTHONPATH": str(SRC_ROOT)}
    log = open(log_path, "w+b")  # noqa: SIM115 - closed with the process by the caller
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "shardcast", *args],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + 60  # a process start takes >20 s on a loaded 2-core machine
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if '"shardcast server up"' in line:
                return proc, json.loads(line)["url"]
        if proc.poll() is not None:
            raise RuntimeError(f"service exited: {log_path.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("service did not start")


# the publisher (the trainer) of every test version: its key signs, its address is believed
KEY = "0x" + "5c" * 32
RUN = "pool-1"  # the run every test version names (a pool's run id)
PUBLISHER = "0x" + "0" * 40  # replaced below by the key's address


def _key_file() -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="shardcast-test-key-")
    os.write(fd, KEY.encode())
    os.close(fd)
    return path


def signed_origin(cfg, key: str = KEY):
    """An origin of the test run (unless `cfg` names another) that signs what it publishes
    with the test publisher's key."""
    from meshrl.shardcast import Origin

    return Origin(cfg if cfg.run else cfg.model_copy(update={"run": RUN}), key=key)


def signed_client(urls, cfg=None, **kw):
    """A client of the test run that believes only the test publisher."""
    from meshrl.shardcast import ShardcastClient

    return ShardcastClient(urls, cfg, publisher=kw.pop("publisher", PUBLISHER),
                           run=kw.pop("run", RUN), **kw)


def _address() -> str:
    from meshrl.wire.signing import address_of

    return address_of(KEY)


PUBLISHER = _address()
KEY_FILE = _key_file()


def relay_cfg(**kw):
    """A relay's config of the test run that believes only the test publisher."""
    from meshrl.shardcast import RelayConfig

    return RelayConfig(publisher=PUBLISHER, **{"run": RUN, **kw})
