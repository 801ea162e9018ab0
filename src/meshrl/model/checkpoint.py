"""Model directories in the Hugging Face layout: config.json + model.safetensors (+ tokenizer)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["load_model", "save_model"]


def save_model(model: Any, tokenizer: Any, directory: str | Path) -> Path:
    """Write `model` (safetensors) and `tokenizer` to `directory` atomically (temp dir + rename)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save(tmp)
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_model(directory: str | Path, dtype: Any = None) -> Any:
    """Load a causal LM from a local HF directory (never from the network)."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory}: not a model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(
        str(directory), local_files_only=True, dtype=dtype or torch.float32
    )
    return model.eval()
