"""`meshrl train` / `meshrl eval` from the command line, and the package's public surface."""

from __future__ import annotations

import json
import subprocess
import sys

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
    for name in meshrl.rl.__all__:
        assert getattr(meshrl.rl, name) is not None
    assert {"train", "RLConfig", "RolloutPipeline", "Trainer", "is_fresh"} <= set(meshrl.rl.__all__)


def test_train_then_eval_from_the_command_line(tmp_path, capsys):
    args = [
        "train", "--run.dir", str(tmp_path), "--run.name", "cli", "--steps", "2",
        "--run.progress", "false", "--sft.max_steps", "2", "--sft.eval_every", "1",
        "--eval.num_problems", "16", "--rollout.prompts_per_step", "2",
        "--rollout.group_size", "2", "--rollout.max_new_tokens", "3",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2
    assert (tmp_path / "cli" / "curves.png").stat().st_size > 1000
    records = [json.loads(x) for x in (tmp_path / "cli" / "metrics.jsonl").read_text().split("\n")
               if x]
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 2
    for key in ("reward", "accuracy", "entropy", "grad_norm", "clip_fraction", "staleness",
                "tokens_per_s", "wait_seconds"):
        assert key in steps[-1] or steps[-1]["kept_groups"] == 0, key
    assert main(["eval", "--checkpoint", str(tmp_path / "cli"), "--eval.num_problems", "16"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= result["accuracy"] <= 1.0 and result["n"] == 16
    assert result["model"].endswith("step_2/model")
