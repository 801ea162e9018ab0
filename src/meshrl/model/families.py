"""The model families a pool can train: which local Hugging Face directories meshrl takes.

Every role loads the policy directory as it is (`config.json`, `*.safetensors` shards,
`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`); this module says, from
`config.json` alone and before any weights are read, whether meshrl knows the family. The fast
CPU engine supports a subset of each family (`meshrl.inference.transformer.ModelSpec` says
which); anything else of a known family runs on the reference backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshrl.config import InputError

__all__ = ["FAMILIES", "ModelNotFoundError", "UnsupportedModelError", "check_model_config",
           "check_model_dir", "read_model_config", "require_model_dir"]

# model_type -> the causal-LM class names its config.json may list under `architectures`
FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen2": ("Qwen2ForCausalLM",),  # Qwen2 and Qwen2.5
    "qwen3": ("Qwen3ForCausalLM",),  # q / k norms, explicit head_dim
    "llama": ("LlamaForCausalLM",),  # Llama 2 / 3 / 3.1 / 3.2 (llama3 RoPE scaling)
}


class UnsupportedModelError(InputError):
    """A model directory meshrl cannot use: not a model, or a family it does not know."""


class ModelNotFoundError(UnsupportedModelError, FileNotFoundError):
    """A model directory that does not exist, or holds no `config.json` (still a
    `FileNotFoundError` for callers that catch those)."""


def require_model_dir(directory: str | Path) -> Path:
    """`directory`, or a `ModelNotFoundError` naming what is missing: checked before any
    loader runs, since transformers would read a missing path as a Hub repo id."""
    directory = Path(directory)
    if not directory.exists():
        raise ModelNotFoundError(f"model directory {directory} does not exist")
    if not (directory / "config.json").is_file():
        raise ModelNotFoundError(f"{directory}: not a model directory (no config.json)")
    return directory


def read_model_config(directory: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a model directory, or an `UnsupportedModelError`."""
    path = require_model_dir(directory) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnsupportedModelError(f"{path}: unreadable config.json ({e})") from e
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"{path}: config.json is not a JSON object")
    return data


def check_model_config(config: dict[str, Any], where: str = "config.json") -> str:
    """The model_type of a known family, or an `UnsupportedModelError` naming the problem."""
    model_type = config.get("model_type")
    known = ", ".join(sorted(FAMILIES))
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{where}: unsupported architecture model_type {model_type!r} (supported: {known})")
    archs = config.get("architectures") or list(FAMILIES[model_type])
    if not isinstance(archs, list) or not archs:
        raise UnsupportedModelError(f"{where}: `architectures` must be a list of class names")
    bad = [a for a in archs if a not in FAMILIES[model_type]]
    if bad:
        raise UnsupportedModelError(
            f"{where}: unsupported architectures entry {bad[0]!r} for model_type "
            f"{model_type!r} (supported: {', '.join(FAMILIES[model_type])})")
    return str(model_type)


def check_model_dir(directory: str | Path) -> str:
    """The model_type of the model directory `directory`, or the one-line error a loader would
    raise (`ModelNotFoundError`, `UnsupportedModelError`): from `config.json` alone, without
    torch, so a command refuses a wrong path before seconds of imports."""
    path = require_model_dir(directory) / "config.json"
    return check_model_config(read_model_config(directory), str(path))
