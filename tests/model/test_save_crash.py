"""`save_model` replaces a model directory so that a process killed mid-save loses nothing."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from meshrl.model import CharTokenizer, build_model, load_model, save_model

TOK = CharTokenizer()


def _model(seed: int):
    return build_model("qwen2-tiny", TOK.vocab_size, seed=seed)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))


def _kill_during_save(directory: Path, fn: str, nth: int) -> None:
    """Save the seed-2 model over `directory` in a forked child that SIGKILLs itself at its
    `nth` call of `os.replace` or `shutil.rmtree` (before / after the swap, at a legacy move)."""
    model = _model(2)  # built here: the child only serialises (no compute after fork)
    pid = os.fork()
    if pid == 0:  # the child
        try:
            module, name = (os, "replace") if fn == "replace" else (shutil, "rmtree")
            real, calls = getattr(module, name), [0]

            def dying(*args, **kwargs):
                calls[0] += 1
                if calls[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)

            setattr(module, name, dying)
            save_model(model, TOK, directory)
        finally:
            os._exit(0)  # not reached when the kill came
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize(("fn", "nth", "survivor"), [
    ("replace", 1, 1),  # killed at the swap: the old model is still there
    ("rmtree", 1, 2),  # killed after the swap, before cleaning up: the new one
])
def test_kill_during_save_leaves_a_complete_model(tmp_path, fn, nth, survivor):
    directory = tmp_path / "model"
    save_model(_model(1), TOK, directory)
    _kill_during_save(directory, fn, nth)
    assert _same(load_model(directory), _model(survivor))
    save_model(_model(3), TOK, directory)  # and the next save cleans up what the kill left
    assert _same(load_model(directory), _model(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model", os.readlink(directory)])


def test_kill_while_replacing_a_legacy_directory(tmp_path):
    """A real directory (written before models were links) moved aside by a killed save is put
    back when the model is next loaded."""
    directory = tmp_path / "model"
    _model(1).save_pretrained(str(directory), safe_serialization=True)
    TOK.save(directory)
    _kill_during_save(directory, "replace", 2)  # after the move aside, before the swap
    assert not directory.exists()
    assert _same(load_model(directory), _model(1))
    assert directory.is_dir() and not directory.is_symlink()


def test_save_replaces_and_keeps_one_version(tmp_path):
    directory = tmp_path / "m"
    for seed in (1, 2, 3):
        save_model(_model(seed), TOK, directory)
        assert _same(load_model(directory), _model(seed))
    assert directory.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m", os.readlink(directory)])
    assert {p.name for p in directory.iterdir()} >= {"config.json", "model.safetensors"}
