"""The public surface of meshrl.toploc, and the CLI registration."""

import importlib.util
import subprocess
import sys

import meshrl.toploc as toploc


def test_all_names_resolve():
    assert sorted(toploc.__all__) == sorted(toploc._WHERE)
    for name in toploc.__all__:
        assert getattr(toploc, name) is not None
    assert {"build_proofs", "verify_proofs", "verdict", "calibrate_thresholds"} <= set(dir(toploc))


def test_toploc_keeps_proofs_and_thresholds_and_judges_no_rollout():
    """One validator: the checks that judge a rollout are `meshrl.validator`'s; toploc gives
    the statistical verdict on proofs (`ProofVerdict`), never a decision on a file."""
    for gone in ("validate", "checks"):
        assert importlib.util.find_spec(f"meshrl.toploc.{gone}") is None
    for name in ("validate_rollout", "RolloutReport", "CheckResult", "ValidatorConfig",
                 "Claim", "Verdict", "check_termination", "check_sampling"):
        assert name not in toploc.__all__ and not hasattr(toploc, name), name
    assert toploc.verdict([]).__class__ is toploc.ProofVerdict


def test_cli_help_does_not_import_torch():
    code = ("import sys; from meshrl.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from meshrl.cli import main

    assert main(["toploc", "calibrate", "--no_such_key", "1"]) == 2
