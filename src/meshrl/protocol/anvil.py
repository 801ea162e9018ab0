"""A local anvil node on 127.0.0.1: find the binary, start it on a free port, stop it.

The binary comes from the npm package `@foundry-rs/anvil-linux-amd64` that `make setup`
installs into the repository's `node_modules/.bin`; an explicit path or `PATH` also work.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

import psutil

from meshrl.protocol.backend import RpcBackend
from meshrl.protocol.errors import ChainError

__all__ = ["AnvilNode", "find_anvil"]

_REPO_ROOT = Path(__file__).resolve().parents[3]


def find_anvil(explicit: str | None = None) -> str | None:
    """Path of an anvil binary: `explicit`, then ./node_modules/.bin, the repo's, then PATH."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for root in (Path.cwd(), _REPO_ROOT):
        candidate = root / "node_modules" / ".bin" / "anvil"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("anvil")


_PORT_TRIES = 5


def _answers(backend: RpcBackend) -> bool:
    try:
        backend.w3.eth.block_number  # noqa: B018 - a cheap liveness probe
    except Exception:
        return False
    return True


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` is the one listening on 127.0.0.1:`port`."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AnvilNode:
    """An anvil child process; use as a context manager or call `start()` / `stop()`."""

    def __init__(
        self,
        binary: str | None = None,
        port: int = 0,
        chain_id: int = 31337,
        state_file: str | None = None,
    ):
        found = find_anvil(binary)
        if found is None:
            raise ChainError("anvil not found: run `make setup` (npm install) or set its path")
        self.binary = found
        self._picked = not port  # a port picked here may be taken before anvil binds it
        self.port = port or _free_port()
        self.chain_id = chain_id
        self.state_file = state_file
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> RpcBackend:
        # a free port picked here can be bound by another process (another anvil on a busy
        # machine) before anvil binds it: anvil then exits "Address already in use", and a
        # picked port is picked again; a port the caller chose is never changed
        for _ in range(_PORT_TRIES):
            backend = self._start_once(timeout)
            if backend is not None:
                return backend
            self.port = _free_port()
        raise ChainError(f"anvil did not start: no free port in {_PORT_TRIES} tries")

    def _start_once(self, timeout: float) -> RpcBackend | None:
        """The node on `self.port`, or None when that port was taken."""
        cmd = [
            self.binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--chain-id",
            str(self.chain_id),
            "--silent",
        ]
        if self.state_file:
            cmd += ["--state", self.state_file]
        # stderr goes to a file, not a pipe nobody drains (a full pipe would stall anvil)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._stderr)
        backend = RpcBackend(self.url)
        probe = RpcBackend(self.url, timeout=2.0)  # a listener that never answers costs 2 s
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self._stop_and_read_stderr()
                if self._picked and "address already in use" in err.lower():
                    return None
                raise ChainError(f"anvil did not start: {err}")
            # the answer must come from our process: on a taken port another node answers
            # while ours is still starting or exiting
            if _answers(probe) and _listens(self.proc.pid, self.port):
                return backend
            if time.monotonic() > deadline:
                err = self._stop_and_read_stderr()
                raise ChainError(f"anvil did not start: {err}")
            time.sleep(0.05)

    def _stop_and_read_stderr(self) -> str:
        err = b""
        if self._stderr is not None:
            self._stderr.seek(0)
            err = self._stderr.read()
        self.stop()
        return err.decode(errors="replace")[-500:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> RpcBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
