"""Model directories in the Hugging Face layout: config.json + model.safetensors (+ tokenizer)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from meshrl.durable import fsync_tree, replace
from meshrl.model.families import check_model_config, read_model_config, require_model_dir

__all__ = ["cast_state", "load_model", "read_weights", "save_model"]


def save_model(model: Any, tokenizer: Any, directory: str | Path, dtype: Any = None) -> Path:
    """Write `model` (safetensors) and `tokenizer` to `directory`, replacing it atomically;
    with `dtype` (e.g. torch.bfloat16) its floating-point tensors are stored rounded to it
    (`Tensor.to`: round to nearest even), the model itself untouched.

    `directory` is a symlink to a hidden sibling `.<name>.v-<random>` holding the files. A new
    version is written completely (and fsynced) into a fresh sibling, then one rename swaps the
    link: a crash at any moment leaves `directory` naming a complete model, old or new. (Two
    renames of real directories would leave no directory at all between them.)
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    _recover(directory)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.v-", dir=directory.parent))
    try:
        state = None if dtype is None else cast_state(model.state_dict(), dtype)
        model.save_pretrained(str(tmp), safe_serialization=True, state_dict=state)
        if tokenizer is not None:
            tokenizer.save(tmp)
        fsync_tree(tmp)
        if directory.exists() and not directory.is_symlink():  # written by an older meshrl
            os.replace(directory, _legacy(directory))  # `_recover` undoes a crash right here
        link = directory.with_name(f".{directory.name}.link-{tmp.name[-8:]}")
        os.symlink(tmp.name, link)
        replace(link, directory)  # the atomic swap, durable
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sweep(directory)
    return directory


def cast_state(state: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """`state` with its floating-point tensors cast to `dtype`; tensors that shared storage
    (tied embeddings) still share one cast tensor, so save_pretrained drops the tied copy."""
    cast: dict[tuple[int, Any, Any, Any], Any] = {}
    out: dict[str, Any] = {}
    for k, v in state.items():
        if not v.is_floating_point():
            out[k] = v
            continue
        key = (v.data_ptr(), v.dtype, tuple(v.shape), tuple(v.stride()))
        if key not in cast:
            cast[key] = v.detach().to(dtype)
        out[k] = cast[key]
    return out


def read_weights(directory: str | Path) -> dict[str, Any]:
    """The tensors of a local HF model directory's safetensors files (every shard), after the
    same family check as `load_model`, without building a model: a worker's hot load (building
    a transformers model per version to take its state dict cost ~10% of a worker's CPU)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    _recover(directory)
    require_model_dir(directory)
    check_model_config(read_model_config(directory), str(directory / "config.json"))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors files")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _legacy(directory: Path) -> Path:
    return directory.with_name(f".{directory.name}.v-legacy")


def _recover(directory: Path) -> None:
    """Put back a real model directory that a crash left moved aside (see `save_model`)."""
    legacy = _legacy(directory)
    if not directory.exists() and not directory.is_symlink() and legacy.is_dir():
        os.replace(legacy, directory)


def _sweep(directory: Path) -> None:
    """Delete the versions and links of `directory` that it no longer points at."""
    current = os.readlink(directory) if directory.is_symlink() else None
    for sibling in directory.parent.glob(f".{directory.name}.*"):
        if sibling.name == current or not sibling.name[len(directory.name) + 2 :].startswith(
                ("v-", "link-")):
            continue
        if sibling.is_symlink() or sibling.is_file():
            sibling.unlink(missing_ok=True)
        else:
            shutil.rmtree(sibling, ignore_errors=True)


def load_model(directory: str | Path, dtype: Any = None) -> Any:
    """Load a causal LM from a local HF directory (never from the network), sharded or not.

    A directory of a family meshrl does not know is refused before any weight is read
    (`UnsupportedModelError`, naming the model_type or architectures entry)."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    _recover(directory)
    if not sys.stderr.isatty():  # a role's log file: no "Loading weights" bar per hot-load
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    require_model_dir(directory)
    check_model_config(read_model_config(directory), str(directory / "config.json"))
    model = AutoModelForCausalLM.from_pretrained(
        str(directory), local_files_only=True, dtype=dtype or torch.float32
    )
    return model.eval()
