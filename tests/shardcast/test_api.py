import subprocess
import sys
import types

import meshrl.shardcast as sc
from meshrl.cli import main as cli

from .conftest import KEY_FILE, RUN, SRC_ROOT, make_file


def test_public_surface_is_exactly_all():
    exported = {n for n in dir(sc)
                if not n.startswith("_") and not isinstance(getattr(sc, n), types.ModuleType)}
    assert exported == set(sc.__all__)


def test_cli_help_is_fast_and_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--help"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(SRC_ROOT)},
                         timeout=30)
    assert out.returncode == 0
    for key in ("--server.urls", "--client.concurrency", "--version", "--out", "--follow"):
        assert key in out.stdout


def test_cli_rejects_unknown_keys_and_missing_source(tmp_path, capsys):
    assert cli(["shardcast", "fetch", "--server.url", "x"]) == 2
    assert "did you mean 'server.urls'" in capsys.readouterr().err
    assert cli(["shardcast", "publish", "--root", str(tmp_path)]) == 2
    src = make_file(tmp_path / "w.bin", 100, 1)
    args = ["shardcast", "publish", "--key_file", KEY_FILE, "--run", RUN,
            "--src", str(src), "--root", str(tmp_path / "o")]
    assert cli([*args, "--shard_size", "10"]) == 0
    assert cli([*args, "--version", "0"]) == 1  # version 0 exists already
    assert "already exists" in capsys.readouterr().err
    assert cli(args) == 0  # the next version number is picked: 1
    assert '"version": 1' in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["v0", "v1"]
