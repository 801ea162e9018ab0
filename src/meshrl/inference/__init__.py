"""Rollout inference: batched generation with log-probs, hidden states and replayable sampling."""

from meshrl.inference.sampling import (
    check_sampled_tokens,
    gumbel_noise,
    sample_tokens,
    token_margins,
    top_p_mask,
)

__all__ = ["check_sampled_tokens", "gumbel_noise", "sample_tokens", "token_margins", "top_p_mask"]
