"""Checkpoint and resume: a run cut in two matches an uninterrupted one, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from meshrl.rl.checkpoint import latest_checkpoint, save_checkpoint
from meshrl.rl.loop import RLRun, train


def _params(run_dir):
    from meshrl.model import load_model

    model = load_model(latest_checkpoint(run_dir / "checkpoints") / "model")
    return torch.cat([p.flatten() for p in model.parameters()])


def _rewards(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["reward"] for r in map(json.loads, lines) if r["kind"] == "step"]


@pytest.mark.parametrize("async_level", [0, 2])
def test_resumed_run_matches_uninterrupted(tiny_cfg, async_level):
    full = tiny_cfg(steps=6, async_level=async_level, **{"run.name": "full"})
    train(full)
    first = tiny_cfg(steps=3, async_level=async_level, **{"run.name": "cut"})
    train(first)  # "killed" after the step-3 checkpoint
    second = tiny_cfg(steps=6, async_level=async_level, **{"run.name": "cut"})
    summary = train(second)
    assert summary["steps"] == 6
    runs = full.run.dir
    from pathlib import Path

    full_dir, cut_dir = Path(runs) / "full", Path(runs) / "cut"
    assert torch.equal(_params(full_dir), _params(cut_dir))
    assert _rewards(full_dir) == _rewards(cut_dir)  # same data, none repeated or skipped
    assert not torch.equal(_params(full_dir), _params(cut_dir) * 0)  # sanity: weights exist


def test_half_written_checkpoint_is_ignored(tiny_cfg, tmp_path):
    cfg = tiny_cfg(steps=2, async_level=1)
    train(cfg)
    root = tmp_path / "runs" / "arithmetic" / "checkpoints"
    assert latest_checkpoint(root).name == "step_2"
    (root / ".step_9.crashed").mkdir()  # a kill during a write leaves only a temp dir
    (root / "step_7").mkdir()  # or a directory without trainer state
    assert latest_checkpoint(root).name == "step_2"
    run = RLRun(tiny_cfg(steps=3, async_level=1))
    save_checkpoint(root, 3, run.model, run.tokenizer, {"x": 1}, keep=2)
    assert sorted(p.name for p in root.glob("step_*") if (p / "trainer_state.pt").exists()) == [
        "step_2", "step_3"]


@pytest.mark.slow
def test_sigkill_at_any_point_then_restart_matches(tiny_cfg, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    args = {"steps": 8, "async_level": 2, "run.checkpoint_every": 2}
    train(tiny_cfg(**args, **{"run.name": "full"}))
    cfg = tiny_cfg(**args, **{"run.name": "killed"})
    cli = [sys.executable, "-m", "meshrl.cli", "train"]
    for key, value in cfg.model_dump(exclude_none=True).items():
        if isinstance(value, dict):
            cli += [f"--{key}.{k}={json.dumps(v) if not isinstance(v, str) else v}"
                    for k, v in value.items() if v is not None and not isinstance(v, list | dict)]
        else:
            cli += [f"--{key}={json.dumps(value)}"]
    proc = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    ckpts = tmp_path / "runs" / "killed" / "checkpoints"
    deadline = time.time() + 300
    while latest_checkpoint(ckpts) is None or latest_checkpoint(ckpts).name == "step_2":
        assert proc.poll() is None and time.time() < deadline, "trainer ended before the kill"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-run, possibly mid-write of the next checkpoint
    proc.wait()
    killed_at = int(latest_checkpoint(ckpts).name.split("_")[1])
    assert 4 <= killed_at < 8
    assert train(cfg)["steps"] == 8
    full_dir, cut_dir = tmp_path / "runs" / "full", tmp_path / "runs" / "killed"
    assert torch.equal(_params(full_dir), _params(cut_dir))
    by_step = {}
    for r in map(json.loads, (cut_dir / "metrics.jsonl").read_text().splitlines()):
        if r["kind"] == "step":
            by_step[r["step"]] = r["reward"]  # steps after the checkpoint were logged twice
    assert [by_step[s] for s in sorted(by_step)] == _rewards(full_dir)
