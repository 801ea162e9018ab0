"""The validator's recomputation: one prefill of prompt + completion through the inference contract.

A validator scores each claimed completion with an `InferenceBackend` (`score` with hidden states
and logits) on the claimed policy version. `mode_backend` is the reference backend in one of the
HONEST_MODES, which vary what an honest validator may legitimately differ in from the worker
(batch size, padding, threads, attention kernel, fp32), so tests see the real float noise
between honest parties; hand it to the validator's `meshrl.validator.replay.replay_files` to
judge files with it, or score with it directly (`recompute_mode`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from meshrl.inference import ReferenceBackend, ReferenceConfig, ScoreResult
from meshrl.toploc.modes import HONEST_MODES

__all__ = ["HONEST_MODES", "mode_backend", "recompute_mode"]

# reference-backend batching of each mode ("threads-alt" also changes the thread count)
_BATCHING = {
    "bf16-batch8": ReferenceConfig(max_batch_size=8),
    "bf16-batch1": ReferenceConfig(max_batch_size=1),
    "bf16-leftpad-batch16": ReferenceConfig(max_batch_size=16, score_padding="left",
                                            score_pad_to=200),
    "bf16-threads-alt": ReferenceConfig(max_batch_size=5),
    "bf16-eager": ReferenceConfig(max_batch_size=8),
    "fp32": ReferenceConfig(max_batch_size=8),
    "fp32-eager-leftpad": ReferenceConfig(max_batch_size=32, score_padding="left"),
    "fp32-batch3": ReferenceConfig(max_batch_size=3),
}


def _variant(model: torch.nn.Module, fp32: bool, attn: str | None) -> torch.nn.Module:
    if not fp32 and attn is None:
        return model
    out = copy.deepcopy(model)
    if fp32:
        out = out.float()
    if attn is not None:
        out.set_attn_implementation(attn)
    return out


class _OtherThreads(ReferenceBackend):
    """The reference backend scoring on another thread count than its caller's (1, or 2 when
    the caller runs on 1)."""

    def score(self, *args: Any, **kwargs: Any) -> list[ScoreResult]:
        n = torch.get_num_threads()
        torch.set_num_threads(2 if n == 1 else 1)
        try:
            return super().score(*args, **kwargs)
        finally:
            torch.set_num_threads(n)


def mode_backend(model: torch.nn.Module, mode: str) -> ReferenceBackend:
    """The reference backend recomputing as honest validator mode `mode` does (the model itself
    is never modified: fp32 and eager modes score a copy)."""
    if mode not in HONEST_MODES:
        raise ValueError(f"unknown recompute mode {mode!r}; known: {', '.join(HONEST_MODES)}")
    cls = _OtherThreads if mode == "bf16-threads-alt" else ReferenceBackend
    return cls(_variant(model, mode.startswith("fp32"), "eager" if "eager" in mode else None),
               cfg=_BATCHING[mode])


def recompute_mode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    mode: str,
) -> list[ScoreResult]:
    """Hidden states and logits of each completion, scored in one of the HONEST_MODES."""
    return mode_backend(model, mode).score([list(p) for p in prompts],
                                           [list(c) for c in completions],
                                           return_hidden_states=True, return_logits=True)
