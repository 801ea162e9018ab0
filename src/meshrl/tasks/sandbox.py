"""Run an untrusted Python program in a bubblewrap sandbox, within hard limits.

A code task's answer is a program written by a model a worker runs and a validator re-runs, so
the program is hostile by assumption. Each run is one `bwrap` process:

- the file system is only `/usr` (read-only, with the `/bin`, `/lib`, `/lib64` links), a
  private `/proc` and `/dev`, a private size-capped tmpfs at `/tmp` and the program itself
  (read-only, `/sandbox/main.py`): no `/etc`, no home, no keystore, no repository;
- every namespace is unshared (no network at all: only a loopback that nothing listens on),
  a new session (no terminal injection), and the sandbox dies with its parent;
- as root, bwrap is started as `nobody` (uid 65534), so the process-count limit binds (the
  kernel never limits root's processes);
- `prlimit` inside the sandbox bounds CPU seconds, address space, processes, open files and
  file size (stdout is a file, so the output cap is the file-size limit: a program printing
  forever is killed by SIGXFSZ); a wall clock outside kills the whole process group;
- the hash seed is fixed (`PYTHONHASHSEED=0`), so a program prints the same set or frozenset
  order on every run and every machine: a tool's output is re-run byte for byte.

The grader runs outside: the program reads a test's input on stdin and its stdout is compared
there, so nothing inside the sandbox can patch the harness. A missing `bwrap` (or `prlimit`,
or the sandbox's Python) is a `SandboxUnavailable` error, never a run without the sandbox.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator

from meshrl.config import Config

__all__ = ["SandboxConfig", "SandboxResult", "SandboxUnavailable", "check_sandbox", "run_sandboxed"]

_NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built on this machine (a binary is missing or bwrap fails)."""


class SandboxConfig(Config):
    """Limits of one sandboxed run of a program (a code task's; published with the task)."""

    bwrap: str = Field("bwrap", description="the bubblewrap binary (a name on PATH or a path)")
    python: str = Field("/usr/bin/python3", description="the Python inside the sandbox (under "
                        "/usr: nothing else is mounted)")
    cpu_s: int = Field(2, ge=1, le=60, description="CPU seconds per run (RLIMIT_CPU)")
    wall_s: float = Field(5.0, gt=0, le=120, description="wall-clock seconds per run")
    memory_mb: int = Field(256, ge=32, le=16384, description="address space per process (MiB)")
    processes: int = Field(8, ge=1, le=256, description="processes of the sandbox's user")
    output_bytes: int = Field(65536, ge=1024, le=1 << 24, description="stdout cap (bytes)")
    tmp_mb: int = Field(16, ge=1, le=1024, description="size of the private /tmp (MiB)")

    @field_validator("bwrap")
    @classmethod
    def _is_bwrap(cls, v: str) -> str:
        # a published rule names the binary that runs peers' programs: only ever bubblewrap
        if Path(v).name != "bwrap":
            raise ValueError(f"sandbox.bwrap must name the bwrap binary, got {v!r}")
        return v


@dataclass(frozen=True)
class SandboxResult:
    """What one run did: exit status (negative: killed by that signal), stdout, and whether
    the wall clock or the output cap ended it."""

    returncode: int
    stdout: str
    timed_out: bool
    output_capped: bool


def _which(name: str, what: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SandboxUnavailable(f"sandbox: {what} {name!r} not found (install bubblewrap: "
                                 f"apt-get install bubblewrap); code is never run unsandboxed")
    return found


def _command(cfg: SandboxConfig, bwrap: str, prlimit: str, program_fd: int) -> list[str]:
    mounts = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if Path(f"/{link}").is_symlink():
            mounts += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif Path(f"/{link}").is_dir():
            mounts += ["--ro-bind", f"/{link}", f"/{link}"]
    limits = [f"--cpu={cfg.cpu_s}", f"--as={cfg.memory_mb << 20}",
              f"--nproc={cfg.processes}", f"--fsize={cfg.output_bytes}", "--nofile=64",
              "--core=0"]
    return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", *mounts, "--proc", "/proc", "--dev", "/dev",
            "--size", str(cfg.tmp_mb << 20), "--tmpfs", "/tmp",
            "--ro-bind-data", str(program_fd), "/sandbox/main.py",
            # read-only root and /dev (tmpfs both): only the size-capped /tmp takes writes
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONHASHSEED", "0",
            # not -I: its -E would ignore the fixed hash seed (set and dict-of-str orders vary
            # per run otherwise); bwrap cleared the environment, -s drops the user site
            "--", prlimit, *limits, "--", cfg.python, "-s", "-B", "/sandbox/main.py"]


def run_sandboxed(program: str, stdin: str, cfg: SandboxConfig) -> SandboxResult:
    """Run `program` (Python source) on `stdin` in the sandbox; raises `SandboxUnavailable`
    when the sandbox cannot be built, never runs the program without it."""
    bwrap = _which(cfg.bwrap, "bubblewrap binary")
    prlimit = _which("prlimit", "util-linux binary")
    if not Path(cfg.python).is_file() or not cfg.python.startswith("/usr/"):
        raise SandboxUnavailable(f"sandbox: Python {cfg.python!r} is not a file under /usr")
    as_root = os.geteuid() == 0
    with tempfile.TemporaryFile() as src, tempfile.TemporaryFile() as inp, \
            tempfile.TemporaryFile() as out:
        src.write(program.encode("utf-8", "replace"))
        src.seek(0)
        inp.write(stdin.encode())
        inp.seek(0)
        cmd = _command(cfg, bwrap, prlimit, src.fileno())
        proc = subprocess.Popen(
            cmd, stdin=inp, stdout=out, stderr=subprocess.DEVNULL, pass_fds=(src.fileno(),),
            start_new_session=True, close_fds=True,
            user=_NOBODY if as_root else None, group=_NOBODY if as_root else None,
            extra_groups=[] if as_root else None,
        )
        timed_out = False
        try:
            proc.wait(timeout=cfg.wall_s)
        except BaseException as e:
            timed_out = isinstance(e, subprocess.TimeoutExpired)
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap and, with it, the pid namespace
            proc.wait()
            if not timed_out:
                raise
        out.seek(0)
        data = out.read(cfg.output_bytes + 1)
    capped = len(data) >= cfg.output_bytes  # the file-size limit stops writes right there
    return SandboxResult(proc.returncode, data[: cfg.output_bytes].decode("utf-8", "replace"),
                         timed_out, capped)


def check_sandbox(cfg: SandboxConfig) -> None:
    """Raise `SandboxUnavailable` (one line naming why) unless a trivial program runs in the
    sandbox and prints what it should: called once when a code task is built, so a machine
    that cannot sandbox refuses at start instead of scoring every program 0."""
    res = run_sandboxed("print(int(input()) + 1)", "41\n", cfg)
    if res.returncode != 0 or res.stdout.strip() != "42":
        why = "timed out" if res.timed_out else f"exit {res.returncode}"
        raise SandboxUnavailable(f"sandbox: {cfg.bwrap} cannot run a trivial program here "
                                 f"({why}); code is never run unsandboxed")
