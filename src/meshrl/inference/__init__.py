"""The one inference contract (`InferenceBackend`, `SamplingParams`, `Completion`) and its two
backends: the fast CPU engine and the naive Hugging Face reference.

Names that need torch are imported on first use (PEP 562), so the light config models and the
CLI can be imported without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrl.inference.backend import (
    Completion,
    EngineUnsupportedError,
    FinishReason,
    InferenceBackend,
    InferenceError,
    InvalidRequestError,
    ScoreResult,
    WeightLoadError,
)
from meshrl.inference.build import build_backend, engine_or_reference, engine_refusal
from meshrl.inference.params import EngineConfig, ReferenceConfig, SamplingParams
from meshrl.lazy import lazy_getattr

if TYPE_CHECKING:
    from meshrl.inference.engine import CPUEngine
    from meshrl.inference.reference import ReferenceBackend
    from meshrl.inference.sampling import (
        BatchSampler,
        check_sampled_tokens,
        gumbel_noise,
        sample_tokens,
        token_margins,
        top_p_mask,
    )

_LAZY = {
    "BatchSampler": "sampling",
    "CPUEngine": "engine",
    "ReferenceBackend": "reference",
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
    "EngineUnsupportedError",
    "FinishReason",
    "InferenceBackend",
    "InferenceError",
    "InvalidRequestError",
    "ReferenceBackend",
    "ReferenceConfig",
    "SamplingParams",
    "ScoreResult",
    "WeightLoadError",
    "build_backend",
    "check_sampled_tokens",
    "engine_or_reference",
    "engine_refusal",
    "gumbel_noise",
    "sample_tokens",
    "token_margins",
    "top_p_mask",
]


__getattr__ = lazy_getattr("meshrl.inference", _LAZY)
