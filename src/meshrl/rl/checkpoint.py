"""Trainer checkpoints: `<run>/checkpoints/step_<n>/` = HF model directory + `trainer_state.pt`.

`trainer_state.pt` holds the optimizer, scheduler, step, RNG states, the data cursor and the
rollout batches in flight (generated but not yet trained on), so a resumed run repeats and skips
nothing. A checkpoint directory is written under a temporary name and renamed when complete, so a
kill at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TRAINER_STATE",
    "latest_checkpoint",
    "load_trainer_state",
    "prune_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

TRAINER_STATE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def save_checkpoint(
    checkpoints_dir: str | Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any],
    keep: int = 2, save_weights: Callable[[Path], None] | None = None,
) -> Path:
    """Atomically write `step_<step>` (model + trainer state); keep the newest `keep` ones.
    `save_weights(directory)` writes the weights instead of `model/` of `model` (LoRA:
    rl/lora.py)."""
    from meshrl.model import save_model

    root = Path(checkpoints_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=root))
    try:
        if save_weights is not None:
            save_weights(tmp)
        else:
            save_model(model, tokenizer, tmp / "model")
        torch.save({**state, "step": step}, tmp / TRAINER_STATE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(root, keep)
    return final


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints under `root`."""
    for old in _checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def _checkpoints(root: Path) -> list[Path]:
    found = [p for p in root.glob("step_*") if (p / TRAINER_STATE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(checkpoints_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = Path(checkpoints_dir)
    found = _checkpoints(root) if root.is_dir() else []
    return found[-1] if found else None


def load_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    return torch.load(Path(checkpoint) / TRAINER_STATE, weights_only=False)
