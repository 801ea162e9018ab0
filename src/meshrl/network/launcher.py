"""Starting `meshrl` role processes without paying for their imports every time.

A role process (`python -m meshrl.cli worker ...`) spends about 2.5 CPU-s importing torch, web3,
pyarrow and its own modules before it does anything: a fifth of a short test network's CPU,
and a stall at every restart. `RoleLauncher` forks those commands instead from one
`multiprocessing` fork server that imported them once (`PRELOAD`, about 4 CPU-s). Each role is
still a process of its own: its own pid, session, log file, environment, working directory,
thread count, signals and exit code, and it runs the same `meshrl.cli.main`; what it shares with
its siblings is memory pages, copied on write. Any other command (anvil, a test's `python -c`)
is started by `subprocess` as before, and so is every command when forking is turned off
(`network up --fork_roles false`).

The fork server is the interpreter's one `multiprocessing` "forkserver" (the isolated rollout
reader uses it too): its preload list is set before it first starts, so the first of the two
to start it decides what it holds; either list works for both, only what is imported once
differs.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

__all__ = ["PRELOAD", "ForkedRole", "RoleLauncher", "RoleProcess", "meshrl_command"]

CLI = "meshrl.cli"
# what the roles import before they do anything (their handlers import them lazily so that
# `meshrl --help` answers fast), and the model classes of every family meshrl runs (the
# worker, validator and trainer build their policy from them: 2.3 CPU-s of imports each);
# not the task libraries only some pools use. A name that fails to import is skipped.
PRELOAD = [CLI, "torch", "meshrl.worker.node", "meshrl.validator.node", "meshrl.rl.loop",
           "meshrl.orchestrator.service", "meshrl.discovery.service", "meshrl.shardcast.server",
           "meshrl.dashboard.app", "meshrl.protocol.rpc_filter", "transformers.modeling_utils",
           "transformers.models.auto.modeling_auto",
           *(f"transformers.models.{f}.modeling_{f}" for f in ("llama", "qwen2", "qwen3"))]


class RoleProcess(Protocol):
    """What the supervisor uses of a role's process: `subprocess.Popen` or a `ForkedRole`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def meshrl_command(argv: list[str]) -> list[str] | None:
    """The `meshrl` arguments of `argv` if it is `python -m meshrl.cli ...` run by this
    interpreter (what `network.roles` builds), else None."""
    if argv[:3] == [sys.executable, "-m", CLI]:
        return argv[3:]
    return None


class ForkedRole:
    """A role forked by the launcher, with `subprocess.Popen`'s `pid`, `returncode`, `poll`,
    `wait`, `send_signal`, `terminate` and `kill` (a negative return code is the signal that
    ended it, as there). Its exit is read from the fork server, which is its parent; once read,
    the process's handle is closed so that a long run's restarts hold no descriptors."""

    def __init__(self, argv: list[str], proc: BaseProcess) -> None:
        self.args = argv
        self._proc: BaseProcess | None = proc
        self.pid: int = proc.pid or 0
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        if self._proc is not None:
            code = self._proc.exitcode
            if code is not None:
                self._code = code
                self._proc.close()
                self._proc = None
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if self._proc is not None:
            self._proc.join(timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # an exited role's pid may be someone else's by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RoleLauncher:
    """Starts a role's command line with its output appended to `log`: forked from the
    preloaded server when it is a `meshrl` command and `fork` is on, else by `subprocess`.
    Either way the process leads a session of its own (a terminal's Ctrl-C reaches only the
    caller, which stops its roles itself)."""

    def __init__(self, fork: bool = True, preload: list[str] | None = None) -> None:
        self.fork = fork
        self._ctx: Any = None
        self._preload = list(PRELOAD if preload is None else preload)
        self._live: list[ForkedRole] = []  # forked and not yet seen to exit
        self._hooked = False

    def warm(self) -> None:
        """Start the fork server now, so that its imports overlap what the caller does next
        (anvil's start, the chain's set-up) instead of delaying the first role."""
        if self.fork:
            from multiprocessing import forkserver

            self._context()
            forkserver.ensure_running()

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> RoleProcess:
        args = meshrl_command(argv)
        if not self.fork or args is None:
            with log.open("ab") as out:
                return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        log.open("ab").close()  # there when this returns, as an exec'd role's log is
        proc = self._context().Process(target=_run_role, name=args[0] if args else CLI,
                                       args=(args, dict(env), os.getcwd(), str(log)))
        proc.start()
        role = ForkedRole(argv, proc)
        if not self._hooked:  # after multiprocessing's own exit hook: this one runs first
            atexit.register(self._end_leftovers)
            self._hooked = True
        self._live = [r for r in self._live if r.poll() is None] + [role]
        return role

    def _end_leftovers(self) -> None:
        """At the caller's exit, SIGKILL the forked roles it never stopped: multiprocessing
        would otherwise wait for them (an exec'd role would have outlived it instead)."""
        for role in self._live:
            if role.poll() is None:
                role.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    role.wait(5)
        self._live = []

    def server_pid(self) -> int | None:
        """The fork server's pid once started (its CPU is the roles' imports, done once)."""
        from multiprocessing import forkserver

        return getattr(forkserver._forkserver, "_forkserver_pid", None) if self._ctx else None

    def _context(self) -> Any:
        if self._ctx is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(self._preload)
            self._ctx = ctx
        return self._ctx


def _run_role(args: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """In the forked child: become the process `python -m meshrl.cli *args` would have been,
    then run it. The server's own process state that exec would have reset is set here."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # as PYTHONUNBUFFERED would: a line at a time
        stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        # torch read the server's thread count when it was imported there
        sys.modules["torch"].set_num_threads(int(threads))
    sys.argv = ["meshrl", *args]
    from meshrl.cli import main

    try:
        code = main()
    finally:  # a forked child ends by os._exit: the interpreter's exit hooks run here
        atexit._run_exitfuncs()
    sys.exit(code)
