"""The role launcher with real processes: a `meshrl` role forked from the preloaded server is the
process an exec'd one would be (its own session, environment, working directory, log, exit
codes and signals), anything else is executed, and roles left running at the caller's exit are
ended instead of holding it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import netutil as nu
import pytest

from meshrl.network.launcher import ForkedRole, RoleLauncher, meshrl_command
from meshrl.protocol.anvil import _free_port

SRC = Path(__file__).resolve().parents[2] / "src"
LAUNCHER = RoleLauncher()  # one fork server for the module, as a supervisor has
EXEC = RoleLauncher(fork=False)


def _meshrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshrl.cli", *args]


def _filter(tmp: Path, name: str) -> tuple[list[str], Path]:
    """A long-running `meshrl` role that says when it is up: the chain's RPC filter (its
    upstream is never asked)."""
    ready = tmp / f"{name}.ready"
    return _meshrl("chain", "rpc-filter", "--upstream", "http://127.0.0.1:9", "--port",
                   str(_free_port()), "--ready_file", str(ready)), ready


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), **extra}


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def test_only_this_interpreters_meshrl_commands_are_forked(tmp_path: Path) -> None:
    assert meshrl_command(_meshrl("worker", "w.toml")) == ["worker", "w.toml"]
    assert meshrl_command(["python3", "-m", "meshrl.cli", "worker"]) is None
    assert meshrl_command([sys.executable, "-c", "pass"]) is None
    other = LAUNCHER.start([sys.executable, "-c", "print('plain')"], tmp_path / "plain.log",
                           _env())
    assert isinstance(other, subprocess.Popen) and other.wait(60) == 0
    off = EXEC.start(_meshrl("keys", "--help"), tmp_path / "off.log", _env())
    assert isinstance(off, subprocess.Popen) and off.wait(60) == 0


def test_a_forked_role_is_its_own_process(tmp_path: Path) -> None:
    argv, ready = _filter(tmp_path, "forked")
    role = LAUNCHER.start(argv, tmp_path / "forked.log", _env())
    assert isinstance(role, ForkedRole)
    nu.wait(ready.is_file, 60, "the role never said it was up", every=0.05)
    assert os.getsid(role.pid) == role.pid  # a session of its own: no terminal's Ctrl-C
    assert _ppid(role.pid) == LAUNCHER.server_pid() != os.getpid()
    assert role.poll() is None and role.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        role.wait(0.1)
    role.send_signal(signal.SIGINT)
    assert role.wait(30) == 0
    assert "rpc filter listening" in (tmp_path / "forked.log").read_text()  # its output


def test_its_environment_and_working_directory_are_the_callers(tmp_path: Path,
                                                                monkeypatch) -> None:
    """Relative paths resolve in the caller's directory, and the keystore's password comes
    from the environment given: with it the command gets as far as the (absent) chain node,
    without it it stops at the password, forked or executed alike."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pw").write_text("pw")
    keys = LAUNCHER.start(_meshrl("keys", "new", "--dir", "k", "--names", '["a"]',
                                  "--password_file", "pw", "--kdf_iterations", "2"),
                          tmp_path / "keys.log", _env())
    assert keys.wait(60) == 0 and (tmp_path / "k" / "a.json").is_file()
    (tmp_path / "dep.json").write_text("{}")
    send = _meshrl("chain", "send", "--to", "0x" + "00" * 19 + "01", "--ether", "1",
                   "--chain.key_file", "k/a.json", "--chain.rpc_url", "http://127.0.0.1:9",
                   "--chain.deployment", "dep.json")
    env = {k: v for k, v in _env().items() if k != "MESHRL_KEYSTORE_PASSWORD"}
    lines = {}
    for launcher in (LAUNCHER, EXEC):
        for password in ("pw", None):
            log = tmp_path / f"{launcher.fork}-{password}.log"
            given = env if password is None else {**env, "MESHRL_KEYSTORE_PASSWORD": password}
            code = launcher.start(send, log, given).wait(120)
            lines[launcher.fork, password] = code, log.read_text().strip().splitlines()[-1]
    assert lines[True, "pw"][1].startswith("meshrl chain send: node at http://127.0.0.1:9 "
                                           "did not answer"), lines
    assert lines[True, None] == (1, "meshrl chain send: keys: no password: set "
                                 "$MESHRL_KEYSTORE_PASSWORD or a password file"), lines
    assert lines[True, "pw"][0] == 1
    assert lines[True, None] == lines[False, None]
    assert lines[True, "pw"][0] == lines[False, "pw"][0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_signals_end_a_forked_role_as_they_end_an_executed_one(tmp_path: Path, sig) -> None:
    codes = []
    for launcher in (LAUNCHER, EXEC):
        argv, ready = _filter(tmp_path, f"{launcher.fork}")
        role = launcher.start(argv, tmp_path / f"{launcher.fork}.log", _env())
        nu.wait(ready.is_file, 60, "the role never said it was up", every=0.05)
        role.send_signal(sig)
        codes.append(role.wait(30))
        role.send_signal(signal.SIGKILL)  # an ended role is never signalled (nor its pid)
    assert codes[0] == codes[1], codes
    if sig == signal.SIGKILL:
        assert codes == [-9, -9]


def test_a_refusal_is_the_same_line_and_exit_code(tmp_path: Path) -> None:
    argv = _meshrl("chain", "rpc-filter", "--port", "not-a-port")
    out = {}
    for launcher in (LAUNCHER, EXEC):
        log = tmp_path / f"{launcher.fork}.log"
        code = launcher.start(argv, log, _env()).wait(60)
        out[launcher.fork] = (code, log.read_text().strip().splitlines()[-1])
    assert out[True] == out[False], out
    assert out[True][0] == 2 and out[True][1].startswith("meshrl chain rpc-filter: ")


def test_roles_left_running_end_with_their_caller(tmp_path: Path) -> None:
    """A caller that exits without stopping its forked roles is not held by them (as
    multiprocessing would hold it), and the roles do not outlive it."""
    argv, ready = _filter(tmp_path, "left")
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        from meshrl.network.launcher import RoleLauncher
        log = pathlib.Path({str(tmp_path)!r}) / "left.log"
        role = RoleLauncher(preload=["meshrl.cli"]).start({argv!r}, log, {_env()!r})
        while not pathlib.Path({str(ready)!r}).is_file():
            time.sleep(0.05)
        print(role.pid, flush=True)
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    nu.wait(lambda: not Path(f"/proc/{pid}").exists() or
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z", 10,
            "the role outlived its caller", every=0.05)
    assert time.monotonic() - t0 < 110


def test_the_preload_holds_every_family_meshrl_runs_and_imports() -> None:
    """Every name the server preloads imports (the server skips one that does not, silently),
    and the model classes of every family are among them: a role building its policy from a
    family left out would import it itself, at each start."""
    import importlib

    from meshrl.model.families import FAMILIES
    from meshrl.network.launcher import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)
    assert {f"transformers.models.{f}.modeling_{f}" for f in FAMILIES} <= set(PRELOAD)
