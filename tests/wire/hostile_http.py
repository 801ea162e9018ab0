"""Hostile peers against a real service process on loopback: the process, raw sockets from
chosen source addresses (127.0.0.0/8 is all loopback, so each attacker is its own IP), honest
latency while an attack runs, and the guard's table sizes from `/metrics`."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from meshrl.wire import SignedClient
from meshrl.wire.models import Heartbeat
from orchestrator.net import stop_process  # tests/ is on sys.path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
HONEST_KEY = "0x" + "11" * 32


class HostileService:
    """`tests/wire/hostile_service.py` as its own process."""

    def __init__(self, tmp: Path, audience: str = "meshrl/31337/test/hostile",
                 name: str = "svc", port: int = 0, **guard: Any) -> None:
        self.tmp, self.audience = tmp, audience
        self.db = tmp / f"{name}.db"
        self.ready = tmp / f"{name}.ready"
        self.log = tmp / f"{name}.log"
        self.config = tmp / f"{name}.json"
        self.config.write_text(json.dumps({"db": str(self.db), "ready_file": str(self.ready),
                                           "audience": audience, "guard": guard,
                                           "port": port}))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> HostileService:
        self.ready.unlink(missing_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "hostile_service.py"), str(self.config)],
                stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(SRC)})
        deadline = time.monotonic() + 30
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log.read_text()[-3000:])
            time.sleep(0.05)
        self.url = self.ready.read_text()
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        stop_process(self.proc)


async def send(url: str, method: str, path: str, body: bytes, headers: dict[str, str],
               source: str = "127.0.0.1") -> tuple[int, Any]:
    """One raw request from `source`: (status, parsed JSON answer)."""
    conn = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=conn) as s, s.request(
            method, URL(url + path, encoded=True), data=body, headers=headers) as r:
        data = await r.read()
        return r.status, json.loads(data) if data else None


async def metrics(url: str) -> dict[str, float]:
    """The guard's tables and the connection count (`meshrl_guard_entries`), by table."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^meshrl_guard_entries\{[^}]*table="(\w+)"\} (\S+)$', text, re.M)}


async def dropped(url: str) -> dict[str, float]:
    """Connections the gate closed, by why (`meshrl_connections_dropped_total`)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^meshrl_connections_dropped_total\{[^}]*why="(\w+)"\} (\S+)$', text,
                        re.M)}


async def health_seconds(url: str) -> float:
    """How long `/health` takes to answer (a fresh connection: as a newcomer would see it)."""
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.get(url + "/health") as r:
        assert r.status == 200
        await r.read()
    return time.perf_counter() - t0


async def honest_latencies(url: str, n: int, key: str = HONEST_KEY, path: str = "/heartbeat",
                           every: float = 0.02) -> list[float]:
    """`n` sequential signed requests from 127.0.0.1, each of which must succeed."""
    out = []
    async with SignedClient(url, key) as c:
        await c.audience()
        for _ in range(n):
            t0 = time.perf_counter()
            await c.call("POST", path, Heartbeat(step=1, tokens_per_s=5.0))
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(every)
    return out


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def connect_from(ip: str, port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ip, 0))


def closed_by_server(sock: socket.socket, wait: float = 0.0) -> bool:
    """True once the server closed (or reset) `sock`; a 408/4xx answer before it counts too."""
    sock.settimeout(wait if wait > 0 else 0.0001)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (TimeoutError, BlockingIOError):
        return False


def in_process(fn: Callable[..., Any], *args: Any) -> tuple[mp.Process, Any]:
    """Run `fn(*args, out)` in a forked process (an attacker with its own CPU and loop); `out`
    is a queue its result goes to."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=fn, args=(*args, out), daemon=True)
    p.start()
    return p, out
