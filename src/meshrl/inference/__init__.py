"""Rollout inference: batched generation with log-probs, hidden states and replayable sampling.

Names that need torch are imported on first use (PEP 562), so the light config models and the
CLI can be imported without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrl.inference.backend import (
    Completion,
    InferenceBackend,
    InferenceError,
    InvalidRequestError,
    ScoreResult,
)
from meshrl.inference.params import EngineConfig, SamplingParams
from meshrl.lazy import lazy_getattr

if TYPE_CHECKING:
    from meshrl.inference.engine import CPUEngine
    from meshrl.inference.sampling import (
        BatchSampler,
        check_sampled_tokens,
        gumbel_noise,
        sample_tokens,
        token_margins,
        top_p_mask,
    )
    from meshrl.inference.transformer import WeightLoadError

_LAZY = {
    "BatchSampler": "sampling",
    "CPUEngine": "engine",
    "WeightLoadError": "transformer",
    "check_sampled_tokens": "sampling",
    "gumbel_noise": "sampling",
    "sample_tokens": "sampling",
    "token_margins": "sampling",
    "top_p_mask": "sampling",
}

__all__ = [
    "BatchSampler",
    "CPUEngine",
    "Completion",
    "EngineConfig",
    "InferenceBackend",
    "InferenceError",
    "InvalidRequestError",
    "SamplingParams",
    "ScoreResult",
    "WeightLoadError",
    "check_sampled_tokens",
    "gumbel_noise",
    "sample_tokens",
    "token_margins",
    "top_p_mask",
]


__getattr__ = lazy_getattr("meshrl.inference", _LAZY)
