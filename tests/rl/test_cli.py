"""`meshrl train` / `meshrl eval` from the command line, and the package's public surface."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

import meshrl.rl
from meshrl.cli import main
from meshrl.config import load_config
from meshrl.rl.config import RLConfig


def test_help_is_fast_and_lists_options():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "meshrl.cli", "train", "--help"],
        capture_output=True, text=True, check=True,
    )
    assert "--trainer.lr" in out.stdout and "--async_level" in out.stdout
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()}
    # heavy imports (transformers, the trainer) happen only in the handler
    assert "transformers" not in imported and "meshrl.rl.loop" not in imported


def test_demo_config_loads_with_overrides():
    cfg = load_config(RLConfig, ["configs/arithmetic.toml"], ["--trainer.lr", "5e-4"])
    assert cfg.trainer.lr == 5e-4 and cfg.async_level == 2
    assert cfg.sft.max_accuracy <= 0.4


def test_public_api_is_exported():
    """Each exported name is the object its module defines (and lists in its own __all__)."""
    for name in meshrl.rl.__all__:
        module = importlib.import_module(f"meshrl.rl.{meshrl.rl._EXPORTS[name]}")
        assert getattr(meshrl.rl, name) is getattr(module, name), name
        assert name in module.__all__, name
        assert importlib.util.find_spec(f"meshrl.rl.{name}") is None, name  # not a submodule
    assert {"train", "RLConfig", "RolloutPipeline", "Trainer", "is_fresh"} <= set(meshrl.rl.__all__)


def test_train_then_eval_from_the_command_line(tmp_path, capsys):
    args = [
        "train", "--run.dir", str(tmp_path), "--run.name", "cli", "--steps", "3",
        "--run.progress", "false", "--sft.max_steps", "2", "--sft.eval_every", "1",
        "--eval.num_problems", "16", "--rollout.prompts_per_step", "2",
        "--rollout.group_size", "2", "--rollout.max_new_tokens", "3", "--filter_groups", "false",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["run_dir"] == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "curves.png").stat().st_size > 1000
    records = [json.loads(x) for x in (tmp_path / "cli" / "metrics.jsonl").read_text().split("\n")
               if x]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    # async_level 2: batch k comes from version max(0, k - 2)
    assert [r["version"] for r in steps] == [0, 0, 0]
    assert [r["staleness"] for r in steps] == [0, 1, 2]
    for r in steps:
        assert (r["groups"], r["kept_groups"]) == (2, 2)  # filtering off: every group trains
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_seconds"], rel=1e-6)
        assert r["entropy"] > 0 and r["grad_norm"] >= 0 and 0 <= r["clip_fraction"] <= 1
        assert r["lr"] == pytest.approx(3e-4 * min(1.0, r["step"] / 6))  # warm-up of 5 steps
        assert r["tokens"] > 4 * 4  # 4 completions behind prompts of >= 4 tokens
    evals = [r for r in records if r["kind"] == "eval" and r["phase"] == "rl"]
    assert evals[-1]["step"] == 3 and evals[-1]["n"] == 16
    # each warm-start evaluation states the budget and the accuracy that ends it (the
    # dashboard's phase line reads them from this file)
    sft = [r for r in records if r["kind"] == "sft"]
    assert sft and all((r["max_steps"], r["target"]) == (2, 0.3) for r in sft)
    from meshrl.dashboard.state import trainer_phase

    warm = trainer_phase(records[:records.index(sft[-1]) + 1])
    assert (warm["phase"], warm["step"], warm["max_steps"]) == ("warm start", sft[-1]["step"], 2)
    rl = trainer_phase(records)
    assert (rl["phase"], rl["step"], rl["accuracy"]) == ("rl", 3, evals[-1]["accuracy"])
    assert summary["accuracy"] == evals[-1]["accuracy"]
    # `meshrl eval` of the run's last checkpoint reproduces the run's own last evaluation
    assert main(["eval", "--checkpoint", str(tmp_path / "cli"), "--eval.num_problems", "16"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"].endswith("step_3/model")
    assert (result["accuracy"], result["mean_tokens"], result["n"]) == (
        evals[-1]["accuracy"], evals[-1]["mean_tokens"], 16)
