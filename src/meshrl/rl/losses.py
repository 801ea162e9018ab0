"""Policy-gradient losses of the GRPO family, as pure functions of shape-annotated tensors.

All take per-token log-probs under the current policy `logprobs` [B, T], under the policy that
generated the rollout (the inference engine's, the *behaviour* policy) `behaviour_logprobs`
[B, T], sequence advantages [B] and a 0/1 `mask` [B, T].

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

Which policy the ratio is taken against depends on `tis_cap`:

- `tis_cap` unset (coupled, as in prime-rl): ratio = pi / pi_behaviour; the clip bounds both the
  update and the staleness of an asynchronous rollout.
- `tis_cap` set (decoupled, as in AReaL): the trainer also passes `proximal_logprobs`, the
  log-probs of the policy just before this update, recomputed by the trainer. The ratio
  pi / pi_prox is clipped (it bounds the update), and each token's loss is multiplied by the
  truncated importance weight w = min(pi_prox / pi_behaviour, tis_cap), detached, which corrects
  for the rollout coming from an older (or numerically different) policy without letting one
  stale token dominate.

Optional terms: entropy bonus (-coef * mean entropy) and KL to a frozen reference policy (k3
estimator, +coef * KL).

Every importance ratio is exp of a log-ratio clamped to [-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]
first (`safe_ratio`): the behaviour log-probs come from a worker's file, and a value no sampler
gives (say -100, on a row the validator did not replay) made exp overflow to inf, whose product
with a clip's zero gradient is NaN. Clamped, the loss and its gradient stay finite for any
finite input; the clips (eps, delta, tis_cap) bind long before e^20, so honest values are
unchanged (only the unbounded side of dapo / dr_grpo's PPO ratio is capped there).
"""

from __future__ import annotations

import torch

from meshrl.rl.config import LossConfig

__all__ = ["LOG_RATIO_LIMIT", "LossConfig", "masked_mean", "policy_loss", "safe_ratio"]

LOG_RATIO_LIMIT = 20.0  # e^20 ~ 4.9e8: finite in float32 / bf16, far past every clip


def safe_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log_ratio) with the log-ratio clamped to +-LOG_RATIO_LIMIT (module docstring)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` where `mask` is 1 (0 where the mask is empty)."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def _per_sequence_then_batch(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(x, mask, dim=1).mean()


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    proximal_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss to minimise, and metrics (clip_fraction, ratio_mean, tis_weight_mean, kl, ...).

    `proximal_logprobs` is required when `cfg.tis_cap` is set (the decoupled objective) and
    refused otherwise; `ref_logprobs` is required when `cfg.kl_coef > 0`.
    """
    _check_shapes(logprobs, behaviour_logprobs, advantages, mask, proximal_logprobs, ref_logprobs,
                  cfg)
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    anchor = behaviour_logprobs if cfg.tis_cap is None else proximal_logprobs
    log_ratio = (logprobs - anchor.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
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

    if cfg.tis_cap is not None:
        raw = safe_ratio(proximal_logprobs - behaviour_logprobs).detach()
        tis = raw.clamp(max=cfg.tis_cap)
        capped = (raw > cfg.tis_cap).to(mask.dtype)
        metrics["tis_capped_fraction"] = masked_mean(capped, mask).item()
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
        loss = loss + cfg.kl_coef * kl

    metrics["clip_fraction"] = masked_mean(is_clipped.to(mask.dtype), mask).item()
    metrics["ratio_mean"] = masked_mean(ratio.detach(), mask).item()
    metrics["policy_loss"] = loss.item()
    return loss, metrics


def _check_shapes(
    logprobs: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    proximal: torch.Tensor | None,
    ref: torch.Tensor | None,
    cfg: LossConfig,
) -> None:
    if cfg.tis_cap is not None and proximal is None:
        raise ValueError("loss.tis_cap needs proximal_logprobs (the decoupled objective)")
    if cfg.tis_cap is None and proximal is not None:
        raise ValueError("proximal_logprobs given without loss.tis_cap: the ratio would ignore it")
    if cfg.kl_coef > 0 and ref is None:
        raise ValueError("loss.kl_coef > 0 needs ref_logprobs from the reference policy")
    for name, t in (("behaviour", behaviour), ("mask", mask), ("proximal", proximal),
                    ("ref", ref)):
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"shape mismatch: logprobs {tuple(logprobs.shape)}, {name}"
                             f" {tuple(t.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={logprobs.shape[0]}, got {advantages.shape}")
