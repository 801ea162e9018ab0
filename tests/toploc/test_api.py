"""The public surface of meshrl.toploc, and the CLI registration."""

import subprocess
import sys

import meshrl.toploc as toploc


def test_all_names_resolve():
    assert sorted(toploc.__all__) == sorted(toploc._WHERE)
    for name in toploc.__all__:
        assert getattr(toploc, name) is not None
    assert {"build_proofs", "verify_proofs", "verdict", "calibrate_thresholds"} <= set(dir(toploc))


def test_cli_help_does_not_import_torch():
    code = ("import sys; from meshrl.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from meshrl.cli import main

    assert main(["toploc", "calibrate", "--no_such_key", "1"]) == 2
