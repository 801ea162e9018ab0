from __future__ import annotations

import pytest
import torch

from meshrl.config import load_config
from meshrl.rl.config import RLConfig


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture
def tiny_args(tmp_path):
    """Command-line arguments of a seconds-long RL run: no warm-start, 4 prompts x 4
    completions, 32 held-out problems; `overrides` become `--key value` pairs."""

    def make(**overrides: object) -> list[str]:
        base = [
            "--run.dir", str(tmp_path / "runs"), "--run.progress", "false",
            "--run.plot", "false", "--run.threads", "1",
            "--sft.max_steps", "0", "--eval.num_problems", "32", "--eval.every", "1000",
            "--rollout.prompts_per_step", "4", "--rollout.group_size", "4",
            "--rollout.max_new_tokens", "4", "--trainer.lr", "3e-3", "--trainer.warmup_steps", "0",
        ]
        extra = []
        for k, v in overrides.items():
            extra += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
        return base + extra

    return make


@pytest.fixture
def tiny_cfg(tiny_args):
    """The `tiny_args` run as an `RLConfig`."""

    def make(**overrides: object) -> RLConfig:
        return load_config(RLConfig, [], tiny_args(**overrides))

    return make
