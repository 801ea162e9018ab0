"""The supervisor of a local network: starts each role as its own process (own session, so a
Ctrl-C reaches only the supervisor, which then stops the roles in reverse order), waits for each
service's health before starting the roles that need it, restarts a role that dies (with a
doubling backoff; a role that keeps dying at start-up ends the run; a role that exits with
`EXIT_REFUSED`, such as a blacklisted worker, is retired), and records every start, exit and
restart in `events.jsonl`. Role output goes to `logs/<role>.log`.

Every wait of the supervisor watches `should_stop` (a Ctrl-C): a role's health wait and the
chain set-up end with `StopRequested`. Stopping is bounded: the roles of a tier get SIGTERM at
once and share one grace period (`stop_roles`), and each `stopped` record says how long its role
took and whether it had to be killed (rc -9).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from meshrl.config import EXIT_REFUSED
from meshrl.log import get_logger, log_event
from meshrl.network.launcher import RoleLauncher, RoleProcess
from meshrl.network.roles import RoleSpec

__all__ = ["Proc", "RoleFailed", "StopRequested", "Supervisor", "healthy",
           "process_cpu_seconds"]

log = get_logger("meshrl.network")
FAST_DEATH_S = 10.0


class RoleFailed(RuntimeError):
    """A role could not be started or kept alive."""


class StopRequested(Exception):
    """`should_stop` became true while the supervisor waited (for a role's health, for the
    chain set-up): the network stops instead of finishing its start."""


@dataclass
class Proc:
    spec: RoleSpec
    popen: RoleProcess | None = None
    started: float = 0.0
    restarts: int = 0
    fast_deaths: int = 0
    due: float = 0.0  # when a dead role is started again (0: not waiting)
    done: bool = False  # not restarted: the trainer at the end of the run, a retired role


class Supervisor:
    def __init__(self, root: Path, backoff_s: float = 1.0, max_fast_deaths: int = 5,
                 launcher: RoleLauncher | None = None) -> None:
        self.root = root
        self.launcher = launcher or RoleLauncher()
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.backoff_s, self.max_fast_deaths = backoff_s, max_fast_deaths
        self.procs: dict[str, Proc] = {}
        self.stopping = False
        self._events: IO[str] = (root / "events.jsonl").open("a")
        self.cpu: dict[str, dict[int, float]] = {}  # role -> pid -> CPU seconds last read
        self.t0, self.cpu0 = time.monotonic(), _own_cpu_seconds()
        self.should_stop: Callable[[], bool] = lambda: False  # watched by every wait

    # ---- starting --------------------------------------------------------------------------
    def start(self, spec: RoleSpec, ready_timeout: float = 120.0) -> Proc:
        p = self.procs.setdefault(spec.name, Proc(spec))
        self._spawn(p)
        if spec.health:
            self.wait_healthy(p, ready_timeout)
        return p

    def _spawn(self, p: Proc) -> None:
        s = p.spec
        threads = str(s.threads)
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
               "PYTHONUNBUFFERED": "1", **s.env}
        p.popen = self.launcher.start(s.argv, self.logs / f"{s.name}.log", env)
        p.started, p.due = time.monotonic(), 0.0
        self.event("start", s.name, pid=p.popen.pid, restarts=p.restarts)

    def wait_healthy(self, p: Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not healthy(p.spec):
            if self.should_stop():
                raise StopRequested(p.spec.name)
            if p.popen is not None and p.popen.poll() is not None:
                raise RoleFailed(f"{p.spec.name} exited with {p.popen.returncode} while "
                                 f"starting; see {self.logs / (p.spec.name + '.log')}")
            if time.monotonic() > deadline:
                raise RoleFailed(f"{p.spec.name} not healthy after {timeout:.0f}s")
            time.sleep(0.2)

    def run_once(self, name: str, argv: list[str]) -> bytes:
        """A one-off command (the chain set-up): its stdout; output to `logs/<name>.log`. Its
        own session, so a terminal's Ctrl-C reaches only the supervisor, which then ends it
        (`StopRequested`) instead of waiting for it to finish."""
        with (self.logs / f"{name}.log").open("ab") as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True)
            try:
                while proc.poll() is None:
                    if self.should_stop():
                        raise StopRequested(name)
                    time.sleep(0.1)
            finally:
                if proc.poll() is None:
                    _end(proc, 3.0)
                    self.event("stopped", name, rc=proc.returncode)
            assert proc.stdout is not None
            out = proc.stdout.read()
            proc.stdout.close()
        if proc.returncode != 0:
            raise RoleFailed(f"{name} failed (exit {proc.returncode}); see "
                             f"{self.logs / (name + '.log')}")
        return out

    # ---- supervising -----------------------------------------------------------------------
    def poll(self) -> list[str]:
        """One supervision round: notice exits, restart what is due. Returns the names of
        critical roles that finished (exited 0)."""
        finished = []
        now = time.monotonic()
        for p in self.procs.values():
            if p.done or p.popen is None:
                continue
            self._read_cpu(p)  # before poll() reaps an exited process
            rc = p.popen.poll()
            if rc is None and p.due == 0.0:
                if now - p.started > FAST_DEATH_S:
                    p.fast_deaths = 0
                continue
            if p.due == 0.0:  # just noticed the exit
                if rc == 0 and p.spec.critical:
                    p.done = True
                    self.event("finished", p.spec.name, rc=rc)
                    finished.append(p.spec.name)
                    continue
                if rc == EXIT_REFUSED:  # refused for good (its log says why): no restart
                    p.done = True
                    self.event("retired", p.spec.name, rc=rc)
                    continue
                self._schedule_restart(p, rc, now)
            elif now >= p.due and not self.stopping:
                p.restarts += 1
                self._spawn(p)
        return finished

    def _read_cpu(self, p: Proc) -> None:
        assert p.popen is not None
        seconds = process_cpu_seconds(p.popen.pid)
        if seconds is not None:
            self.cpu.setdefault(p.spec.name, {})[p.popen.pid] = seconds

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system, the role's reaped children included) per role, every
        process it ran summed; read each supervision round, so a process's last half second
        before it died is missing."""
        for p in self.procs.values():
            if p.popen is not None and p.popen.poll() is None:
                self._read_cpu(p)
        return {name: round(sum(per.values()), 2) for name, per in self.cpu.items()}

    def write_cpu(self, path: Path) -> None:
        """`cpu.json`: CPU seconds per role and of this supervisor, over the wall seconds since
        it started, on this machine's cores (the report's "where the CPU went"); the role
        launcher's fork server is its own row (the roles' imports, done once for them all)."""
        roles = {**self.cpu_seconds(), "supervisor": round(_own_cpu_seconds() - self.cpu0, 2)}
        server = self.launcher.server_pid()
        imports = process_cpu_seconds(server, children=False) if server else None
        if imports is not None:  # its reaped children are the roles, counted above
            roles["role launcher"] = round(imports, 2)
        path.write_text(json.dumps({
            "wall_s": round(time.monotonic() - self.t0, 1), "cores": os.cpu_count() or 1,
            "roles": roles}, indent=1))

    def _schedule_restart(self, p: Proc, rc: int | None, now: float) -> None:
        alive = now - p.started
        p.fast_deaths = p.fast_deaths + 1 if alive < FAST_DEATH_S else 0
        if p.fast_deaths >= self.max_fast_deaths:
            self.event("gave up", p.spec.name, rc=rc)
            raise RoleFailed(f"{p.spec.name} died {p.fast_deaths} times within "
                             f"{FAST_DEATH_S:.0f}s of starting; see its log")
        delay = min(30.0, self.backoff_s * 2 ** max(0, p.fast_deaths - 1))
        p.due = now + delay
        self.event("died", p.spec.name, rc=rc, alive_s=round(alive, 1), restart_in_s=delay)

    def kill(self, name: str) -> int:
        """Fault injection: SIGKILL one role's process; returns its pid."""
        p = self.procs[name]
        assert p.popen is not None
        pid = p.popen.pid
        os.kill(pid, signal.SIGKILL)
        self.event("killed", name, pid=pid)
        return pid

    # ---- stopping --------------------------------------------------------------------------
    def stop_all(self, timeout: float = 10.0) -> None:
        """Stop every role still running: the roles without a health URL first (workers,
        validators, the trainer), then the services in reverse start order, anvil last."""
        self.stop_roles(self.clients(), timeout)
        self.stop_roles([p for p in self.procs.values() if p.spec.health and not p.spec.rpc],
                        timeout)
        self.stop_roles([p for p in self.procs.values() if p.spec.rpc], timeout)  # the chain

    def close(self) -> None:
        self._events.close()

    def clients(self) -> list[Proc]:
        """The roles that use the services (no health URL): stopped before them."""
        return [p for p in self.procs.values() if not p.spec.health]

    def stop_roles(self, procs: list[Proc], timeout: float) -> None:
        """SIGTERM to each of `procs` still running (reverse start order, all at once), then
        wait for them all within one shared `timeout`; SIGKILL what outlives it (rc -9)."""
        self.stopping = True
        live = [p for p in reversed(procs) if p.popen is not None and p.popen.poll() is None]
        t0 = time.monotonic()
        for p in live:
            assert p.popen is not None
            self._read_cpu(p)
            p.popen.send_signal(signal.SIGTERM)
        deadline, waiting = t0 + timeout, list(live)
        while waiting:  # each exit seen within 50 ms, so its `seconds` is its own
            for p in list(waiting):
                assert p.popen is not None
                if p.popen.poll() is None and time.monotonic() < deadline:
                    continue
                if p.popen.poll() is None:  # outlived the grace period
                    p.popen.kill()
                    p.popen.wait()
                waiting.remove(p)
                p.done = True
                self.event("stopped", p.spec.name, rc=p.popen.returncode,
                           seconds=round(time.monotonic() - t0, 2))
            time.sleep(0.05)

    def event(self, what: str, role: str, **fields: Any) -> None:
        record = {"t": time.time(), "event": what, "role": role, **fields}
        if not self._events.closed:
            self._events.write(json.dumps(record) + "\n")
            self._events.flush()
        log_event(log, what, role=role, **fields)


def _end(proc: subprocess.Popen[bytes], grace: float) -> None:
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _own_cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def process_cpu_seconds(pid: int, children: bool = True) -> float | None:
    """utime + stime (+ cutime + cstime with `children`) of `pid` from /proc (None: gone, or no
    /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def healthy(spec: RoleSpec) -> bool:
    try:
        if spec.rpc:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber",
                               "params": []}).encode()
            req = urllib.request.Request(spec.health, body,
                                         {"content-type": "application/json"})
        else:
            req = urllib.request.Request(spec.health)
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
