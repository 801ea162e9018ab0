"""Policy-gradient losses of the GRPO family, as pure functions of shape-annotated tensors.

All take per-token log-probs under the current policy `logprobs` [B, T], under the policy that
generated the rollout `old_logprobs` [B, T], sequence advantages [B] and a 0/1 `mask` [B, T].

- grpo   INTELLECT-2's two-sided clipping: c1 = min(ratio, delta), c2 = clip(ratio, 1-eps, 1+eps),
         per-token loss max(-c1 A, -c2 A). The upper bound delta keeps negative-advantage tokens
         with huge ratios from blowing up the update (plain PPO leaves that side unbounded).
         Normalised per sequence, then averaged over sequences (as in the GRPO paper).
- dapo   clip-higher (eps_low < eps_high) and token-level normalisation over the whole batch.
- dr_grpo  PPO clip, normalised by a constant (B * max_tokens) instead of sequence lengths;
         pair with unnormalised advantages (`LossConfig.normalize_advantage_std` is False).
- gspo   sequence-level ratio exp(mean_t log ratio), clipped per sequence.
- cispo  REINFORCE on every token weighted by a clipped, stopped importance ratio
         (no token's gradient is dropped by clipping).

Optional terms: entropy bonus (-coef * mean entropy), KL to a reference policy (k3 estimator),
and truncated importance sampling (TIS) against the inference engine's own log-probs:
w = min(exp(old_logprobs - inference_logprobs), tis_cap), detached, multiplies each token's loss.
"""

from __future__ import annotations

import torch

from meshrl.rl.config import LossConfig

__all__ = ["LossConfig", "masked_mean", "policy_loss"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` where `mask` is 1 (0 where the mask is empty)."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def _per_sequence_then_batch(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(x, mask, dim=1).mean()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    inference_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss to minimise, and metrics (clip_fraction, ratio_mean, kl, entropy, ...)."""
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: logprobs {tuple(logprobs.shape)}, old {tuple(old_logprobs.shape)},"
            f" mask {tuple(mask.shape)}"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={logprobs.shape[0]}, got {advantages.shape}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    metrics: dict[str, float] = {}

    if cfg.type == "gspo":
        seq_ratio = torch.exp(masked_mean(log_ratio, mask, dim=1))
        clipped = seq_ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
        per_seq = torch.maximum(-seq_ratio * adv[:, 0], -clipped * adv[:, 0])
        token_loss = per_seq[:, None].expand_as(logprobs)
        is_clipped = ((-clipped * adv[:, 0]) > (-seq_ratio * adv[:, 0]))[:, None].expand_as(mask)
    elif cfg.type == "cispo":
        weight = ratio.clamp(max=1 + cfg.eps_high).detach()
        token_loss = -weight * adv * logprobs
        is_clipped = ratio > 1 + cfg.eps_high
    else:
        unclipped = ratio.clamp(max=cfg.delta) if cfg.type == "grpo" else ratio
        clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
        token_loss = torch.maximum(-unclipped * adv, -clipped * adv)
        is_clipped = (-clipped * adv) > (-unclipped * adv)

    if inference_logprobs is not None and cfg.tis_cap is not None:
        tis = torch.exp(old_logprobs - inference_logprobs).clamp(max=cfg.tis_cap).detach()
        token_loss = token_loss * tis
        metrics["tis_weight_mean"] = masked_mean(tis, mask).item()

    if cfg.type in ("grpo", "gspo"):
        loss = _per_sequence_then_batch(token_loss, mask)
    elif cfg.type == "dr_grpo":
        loss = (token_loss * mask).sum() / (mask.shape[0] * cfg.max_tokens)
    else:  # dapo, cispo: token-level normalisation over the whole batch
        loss = masked_mean(token_loss, mask)

    if entropy is not None:
        ent = masked_mean(entropy, mask)
        metrics["entropy"] = ent.item()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - logprobs
        kl = masked_mean(torch.exp(d) - d - 1, mask)  # k3: unbiased, always >= 0
        metrics["kl"] = kl.item()
        if cfg.kl_coef:
            loss = loss + cfg.kl_coef * kl

    metrics["clip_fraction"] = masked_mean(is_clipped.to(mask.dtype), mask).item()
    metrics["ratio_mean"] = masked_mean(ratio.detach(), mask).item()
    metrics["policy_loss"] = loss.item()
    return loss, metrics
