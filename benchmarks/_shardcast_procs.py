"""The processes of the shardcast benchmarks (`bench_shardcast*.py`): an origin, R relays and
C `meshrl shardcast fetch` clients waiting for version 1, each its own process on loopback as
deployed; their CPU time from /proc; and the clean-up of the work directory.

Not a benchmark itself: the `bench_*` scripts import it (it puts this checkout's `src` first on
`sys.path`, and `ENV` gives the processes the same).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
ENV = {**os.environ, "PYTHONPATH": str(SRC)}
# the benchmarks' publisher: it signs version 1, relays and clients believe only it
KEY = "0x" + "b7" * 32
_TICK = os.sysconf("SC_CLK_TCK")


def make_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n


def publisher() -> str:
    """The address of `KEY`."""
    from meshrl.wire.signing import address_of

    return address_of(KEY)


def spawn(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """One `meshrl shardcast` server; returns once it logged its URL."""
    err = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "shardcast", *args],
                            stdout=subprocess.DEVNULL, stderr=err, env=ENV)
    for _ in range(400):
        for line in log.read_text().splitlines():
            if '"shardcast server up"' in line:
                return proc, json.loads(line)["url"]
        time.sleep(0.05)
    raise RuntimeError(log.read_text())


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def wait_cpu(proc: subprocess.Popen) -> tuple[int, float]:
    """Reap `proc`; its exit code and total CPU seconds."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_utime + ru.ru_stime


def health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health") as r:
        return json.load(r)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Tree:
    """The running processes: `servers` is the origin then the relays, `urls` theirs."""

    servers: list[subprocess.Popen]
    urls: list[str]
    clients: list[subprocess.Popen]
    logs: list[Path]  # the clients' stderr

    @property
    def origin(self) -> str:
        return self.urls[0]

    @property
    def relays(self) -> list[str]:
        return self.urls[1:]


@contextlib.contextmanager
def tree(work: Path, relays: int, clients: int, origin_args: Sequence[str] = (),
         relay_args: Sequence[str] = (), client_args: Sequence[str] = (),
         client_stdout: int | IO[bytes] = subprocess.DEVNULL) -> Iterator[Tree]:
    """Start the origin (store `work/origin`), `relays` relays mirroring it and `clients`
    clients fetching version 1 from every server into `work/out{i}`; yields once every client is
    waiting. On exit, whatever still runs is killed and the stores and outputs are deleted."""
    servers: list[subprocess.Popen] = []
    fetchers: list[subprocess.Popen] = []
    try:
        origin, url = spawn(["origin", "--root", str(work / "origin"), "--server.port", "0",
                             "--server.scan_interval", "0.02", *origin_args], work / "origin.log")
        servers.append(origin)
        urls = [url]
        for i in range(relays):
            p, relay_url = spawn(["relay", "--publisher", publisher(), "--root",
                                  str(work / f"relay{i}"), "--upstreams",
                                  json.dumps([url]), "--server.port", "0",
                                  "--client.poll_interval", "0.05", *relay_args],
                                 work / f"relay{i}.log")
            servers.append(p)
            urls.append(relay_url)
        logs = [work / f"client{i}.log" for i in range(clients)]
        for i in range(clients):
            fetchers.append(subprocess.Popen(
                [sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--publisher",
                 publisher(), "--server.urls",
                 json.dumps(urls), "--version", "1", "--out", str(work / f"out{i}"),
                 "--client.fsync", "false", *client_args],
                stdout=client_stdout, stderr=open(logs[i], "wb"), env=ENV))  # noqa: SIM115
        while not all('"fetch start"' in log.read_text() for log in logs):
            time.sleep(0.05)
        time.sleep(0.5)  # every client is up and waiting for version 1
        yield Tree(servers, urls, fetchers, logs)
    finally:
        for p in servers + fetchers:
            if p.returncode is None:
                p.kill()
                p.wait()
        for d in ["origin", *(f"relay{i}" for i in range(relays)),
                  *(f"out{i}" for i in range(clients))]:
            path = work / d
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(
                missing_ok=True)


@contextlib.contextmanager
def workdir(prefix: str, size_mb: float, keep_logs: bool = False) -> Iterator[tuple[Path, Path]]:
    """A fresh directory in /tmp and a file of `size_mb` random MB in it: (work, file). Deleted
    afterwards, all but the logs with `keep_logs` (then their folder is said on stderr)."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        src = work / "src" / "weights.bin"
        src.parent.mkdir()
        make_file(src, int(size_mb * 1_000_000))
        yield work, src
    finally:
        if keep_logs:
            for p in work.iterdir():
                if not p.name.endswith(".log"):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
            print(json.dumps({"logs": str(work)}), file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
