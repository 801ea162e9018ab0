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


def test_lora_run_resumed_matches_uninterrupted_and_trains_only_adapters(tiny_cfg):
    """LoRA: the warm-started policy is frozen as `<run>/base`, a checkpoint holds the
    effective weights (model/) and the adapter (adapter/, loadable by peft itself), and a run
    cut in two matches an uninterrupted one bit for bit."""
    from pathlib import Path

    from peft import PeftModel

    from meshrl.model import load_model
    from meshrl.shardcast.adapter import read_weights, weights_sha256

    # a short warm-start and a length-target reward give every step groups with signal
    lora = {"lora.enabled": True, "lora.rank": 4, "trainer.lr": 1e-2, "sft.max_steps": 15,
            "sft.batch_size": 16, "sft.eval_every": 100, "tasks.length_target.enabled": True,
            "tasks.length_target.targets": "[1,2,3]", "tasks.length_target.alpha": 0.1,
            "run.checkpoint_every": 3}
    full = tiny_cfg(steps=6, async_level=2, **{"run.name": "lora-full", **lora})
    train(full)
    train(tiny_cfg(steps=3, async_level=2, **{"run.name": "lora-cut", **lora}))
    assert train(tiny_cfg(steps=6, async_level=2, **{"run.name": "lora-cut", **lora}))[
        "steps"] == 6
    full_dir, cut_dir = Path(full.run.dir) / "lora-full", Path(full.run.dir) / "lora-cut"
    assert torch.equal(_params(full_dir), _params(cut_dir))
    assert _rewards(full_dir) == _rewards(cut_dir)
    steps = [json.loads(line) for line in (full_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["kept_groups"] > 0 and "loss" in r for r in steps if r["kind"] == "step")

    ckpt = latest_checkpoint(full_dir / "checkpoints")
    base, effective = load_model(full_dir / "base"), load_model(ckpt / "model")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base.state_dict()[q], effective.state_dict()[q])  # it learned
    embed = "model.embed_tokens.weight"  # not a target module: frozen
    assert torch.equal(base.state_dict()[embed], effective.state_dict()[embed])
    # peft's own merge of the checkpoint's adapter gives the same weights (to rounding)
    merged = PeftModel.from_pretrained(base, str(ckpt / "adapter")).merge_and_unload()
    torch.testing.assert_close(merged.state_dict()[q], effective.state_dict()[q],
                               rtol=1e-5, atol=1e-6)
    # model/ is the effective weights exactly as a worker would rebuild them
    from meshrl.shardcast.adapter import materialize, write_effective

    write_effective(ckpt / "adapter", weights_sha256(read_weights(ckpt / "model")
                                                     ["model.safetensors"]))
    assert materialize(ckpt / "adapter", full_dir / "base", full_dir / "rebuilt")
