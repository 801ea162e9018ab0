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

from collections.abc import Callable
from typing import NamedTuple

import torch

from meshrl.rl.config import LossConfig

__all__ = ["LOG_RATIO_LIMIT", "LOSSES", "LossConfig", "TokenTerms", "masked_mean", "policy_loss",
           "safe_ratio"]

LOG_RATIO_LIMIT = 20.0  # e^20 ~ 4.9e8: finite in float32 / bf16, far past every clip


def safe_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log_ratio) with the log-ratio clamped to +-LOG_RATIO_LIMIT (module docstring)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` where `mask` is 1 (0 where the mask is empty)."""
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


class TokenTerms(NamedTuple):
    """One loss's per-token terms, before importance weighting and normalisation."""

    loss: torch.Tensor  # [B, T]
    clipped: torch.Tensor  # [B, T] bool: the clip decided this token's term


def _ppo_clip(ratio: torch.Tensor, adv: torch.Tensor, cfg: LossConfig,
              upper: float | None) -> TokenTerms:
    unclipped = ratio if upper is None else ratio.clamp(max=upper)
    clipped = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    return TokenTerms(torch.maximum(-unclipped * adv, -clipped * adv),
                      (-clipped * adv) > (-unclipped * adv))


def grpo_terms(log_ratio: torch.Tensor, logprobs: torch.Tensor, adv: torch.Tensor,
               mask: torch.Tensor, cfg: LossConfig) -> TokenTerms:
    """INTELLECT-2's two-sided clip: the ratio also bounded above by `cfg.delta`."""
    return _ppo_clip(torch.exp(log_ratio), adv, cfg, upper=cfg.delta)


def ppo_terms(log_ratio: torch.Tensor, logprobs: torch.Tensor, adv: torch.Tensor,
              mask: torch.Tensor, cfg: LossConfig) -> TokenTerms:
    """PPO's clip (dapo's clip-higher when eps_low < eps_high; dr_grpo)."""
    return _ppo_clip(torch.exp(log_ratio), adv, cfg, upper=None)


def gspo_terms(log_ratio: torch.Tensor, logprobs: torch.Tensor, adv: torch.Tensor,
               mask: torch.Tensor, cfg: LossConfig) -> TokenTerms:
    """The sequence's ratio exp(mean_t log ratio), clipped per sequence."""
    seq_ratio = torch.exp(masked_mean(log_ratio, mask, dim=1))
    clipped = seq_ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    a = adv[:, 0]
    per_seq = torch.maximum(-seq_ratio * a, -clipped * a)
    return TokenTerms(per_seq[:, None].expand_as(logprobs),
                      ((-clipped * a) > (-seq_ratio * a))[:, None].expand_as(mask))


def cispo_terms(log_ratio: torch.Tensor, logprobs: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, cfg: LossConfig) -> TokenTerms:
    """REINFORCE on every token, weighted by the clipped, stopped ratio."""
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(max=1 + cfg.eps_high).detach()
    return TokenTerms(-weight * adv * logprobs, ratio > 1 + cfg.eps_high)


def per_sequence_then_batch(token_loss: torch.Tensor, mask: torch.Tensor,
                            cfg: LossConfig) -> torch.Tensor:
    """Each sequence's mean over its tokens, then the mean over sequences (GRPO, GSPO)."""
    return masked_mean(token_loss, mask, dim=1).mean()


def per_token(token_loss: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """The mean over every token of the batch (DAPO, CISPO)."""
    return masked_mean(token_loss, mask)


def per_constant(token_loss: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """The sum over the batch divided by B * max_tokens (Dr. GRPO)."""
    return (token_loss * mask).sum() / (mask.shape[0] * cfg.max_tokens)


_Terms = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossConfig], TokenTerms]
_Normalise = Callable[[torch.Tensor, torch.Tensor, LossConfig], torch.Tensor]

# each loss: its per-token terms and how they are averaged
LOSSES: dict[str, tuple[_Terms, _Normalise]] = {
    "grpo": (grpo_terms, per_sequence_then_batch),
    "dapo": (ppo_terms, per_token),
    "dr_grpo": (ppo_terms, per_constant),
    "gspo": (gspo_terms, per_sequence_then_batch),
    "cispo": (cispo_terms, per_token),
}


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
    terms_of, normalise = LOSSES[cfg.type]
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)[:, None]
    anchor = behaviour_logprobs if cfg.tis_cap is None else proximal_logprobs
    log_ratio = (logprobs - anchor.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    terms = terms_of(log_ratio, logprobs, adv, mask, cfg)
    metrics: dict[str, float] = {}
    token_loss = terms.loss
    if cfg.tis_cap is not None:
        token_loss, tis_metrics = _truncated_importance(token_loss, proximal_logprobs,
                                                        behaviour_logprobs, mask, cfg.tis_cap)
        metrics.update(tis_metrics)
    loss = normalise(token_loss, mask, cfg)
    loss = _regularised(loss, logprobs, mask, cfg, ref_logprobs, entropy, metrics)
    metrics["clip_fraction"] = masked_mean(terms.clipped.to(mask.dtype), mask).item()
    metrics["ratio_mean"] = masked_mean(torch.exp(log_ratio).detach(), mask).item()
    metrics["policy_loss"] = loss.item()
    return loss, metrics


def _truncated_importance(token_loss: torch.Tensor, proximal: torch.Tensor | None,
                          behaviour: torch.Tensor, mask: torch.Tensor,
                          cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Each token's loss times min(pi_prox / pi_behaviour, cap), detached (the decoupled
    objective's correction for a rollout from an older policy)."""
    assert proximal is not None  # _check_shapes refused it
    raw = safe_ratio(proximal - behaviour).detach()
    tis = raw.clamp(max=cap)
    capped = (raw > cap).to(mask.dtype)
    return token_loss * tis, {"tis_capped_fraction": masked_mean(capped, mask).item(),
                              "tis_weight_mean": masked_mean(tis, mask).item()}


def _regularised(loss: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor, cfg: LossConfig,
                 ref: torch.Tensor | None, entropy: torch.Tensor | None,
                 metrics: dict[str, float]) -> torch.Tensor:
    """The entropy bonus and the KL to the reference policy (k3: unbiased, always >= 0)."""
    if entropy is not None:
        ent = masked_mean(entropy, mask)
        metrics["entropy"] = ent.item()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    if ref is not None:
        d = ref.detach() - logprobs
        kl = masked_mean(torch.exp(d) - d - 1, mask)
        metrics["kl"] = kl.item()
        loss = loss + cfg.kl_coef * kl
    return loss


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
