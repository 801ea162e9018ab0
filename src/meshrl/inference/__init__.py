"""Rollout inference: batched generation with log-probs, hidden states and replayable sampling."""

from meshrl.inference.backend import (
    Completion,
    InferenceBackend,
    InferenceError,
    InvalidRequestError,
    SamplingParams,
    ScoreResult,
)
from meshrl.inference.engine import CPUEngine, EngineConfig
from meshrl.inference.sampling import (
    check_sampled_tokens,
    gumbel_noise,
    sample_tokens,
    token_margins,
    top_p_mask,
)
from meshrl.inference.transformer import WeightLoadError

__all__ = [
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
