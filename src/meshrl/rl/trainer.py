"""The policy-gradient trainer: AdamW, warm-up, gradient clipping, micro-batched accumulation.

One optimizer step per rollout batch. By default the "old" log-probs of the clipped objective
are the *inference* log-probs the generator recorded (the behaviour policy, as in prime-rl): with
asynchronous generation the batch comes from a policy up to `async_level` versions old, and the
ratio against the behaviour policy is what the clip must bound.

With `loss.tis_cap` the objective is decoupled (AReaL): the ratio is taken against the proximal
policy, the weights just before this update, and a truncated importance weight
min(pi_prox / pi_behaviour, tis_cap) corrects for staleness (see losses.py). The proximal
log-probs are the detached log-probs of the same forward pass that computes the gradient: every
micro-batch runs before the single optimizer step, so that pass *is* the policy before the
update, and a separate no-grad pass would compute the same numbers for one more forward pass.
(With one update per batch the proximal ratio is 1, so its clip is inactive and the update is
the TIS-weighted policy gradient.)

With `loss.kl_coef > 0` a frozen reference policy (the warm-started one, set by the run) scores
every micro-batch without gradients and the k3 KL to it joins the loss.

A step whose loss or gradient norm is not finite changes nothing: its update is skipped (the
weights and AdamW's moments stay bit-equal), logged with the count of non-finite gradient
elements, and recorded as `update_skipped` in the step's metrics (docs/trainer.md).

Batches come in the shared-prompt layout of `packing.py`: a group's prompt is computed once for
all its completions, which about halves the work of a step on short-answer tasks.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from meshrl.log import get_logger, log_event
from meshrl.rl.config import TrainerConfig
from meshrl.rl.packing import packed_logprobs, slice_groups

__all__ = ["Trainer", "TrainerConfig", "lr_factor"]

log = get_logger("meshrl.rl.trainer")


def lr_factor(cfg: TrainerConfig, step: int, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based) over cfg.lr: linear warm-up to 1, then
    constant, or a linear / cosine decay reaching `min_lr_ratio` at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.decay == "constant":
        return 1.0
    span = max(1, total_steps - 1 - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 1 - progress if cfg.decay == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape


class Trainer:
    """Owns the policy's optimizer and schedule; `train_step` takes one RL step on a batch."""

    def __init__(
        self, model: Any, cfg: TrainerConfig, loss_cfg: Any, temperature: float = 1.0,
        total_steps: int | None = None, reference: Any | None = None,
    ) -> None:
        self.model = model
        self.reference = reference  # frozen policy of the KL term (loss.kl_coef > 0)
        self.cfg = cfg
        self.loss_cfg = loss_cfg
        self.temperature = temperature
        # the trainable parameters only (LoRA: the adapters); a frozen one's stale gradient
        # (left by a full-weight warm start) must not count in the clipped norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr,
            betas=cfg.betas, weight_decay=cfg.weight_decay,
            fused=True,  # one kernel over all parameters: ~4x faster than the per-tensor loop
        )
        if cfg.decay != "constant" and total_steps is None:
            raise ValueError(f"trainer.decay={cfg.decay!r} needs the run's total step count")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(cfg, s, total_steps or 0)
        )

    def logprobs(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Completion-token log-probs and entropies [R, T] of a packed micro-batch."""
        return packed_logprobs(self.model, micro, self.temperature)

    def forward_backward(
        self, micro: dict[str, torch.Tensor], advantages: torch.Tensor, weight: float
    ) -> dict[str, float]:
        """Loss on one micro-batch, backpropagated scaled by `weight` (its share of the batch)."""
        from meshrl.rl.losses import LOG_RATIO_LIMIT, policy_loss

        logprobs, entropy = self.logprobs(micro)
        mask = micro["loss_mask"]
        inference = torch.where(mask, micro["inference_logprobs"], logprobs.detach())
        # the weights before this batch's one optimizer step: the proximal policy (module doc)
        proximal = logprobs.detach() if self.loss_cfg.tis_cap is not None else None
        loss, metrics = policy_loss(
            logprobs, inference, advantages, mask, self.loss_cfg,
            proximal_logprobs=proximal, ref_logprobs=self.reference_logprobs(micro),
            entropy=entropy,
        )
        (loss * weight).backward()
        with torch.no_grad():
            m = mask.float()
            diff = (logprobs.detach() - inference).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT) * m
            metrics["mismatch_kl"] = float((diff.exp() - 1 - diff).sum() / m.sum().clamp(min=1))
        return {"loss": float(loss.detach()), **{k: float(v) for k, v in metrics.items()}}

    def reference_logprobs(self, micro: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Log-probs of the frozen reference policy on `micro` (None without a KL term)."""
        if not self.loss_cfg.kl_coef:
            return None
        if self.reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference policy (Trainer(reference=...))")
        with torch.no_grad():
            return packed_logprobs(self.reference, micro, self.temperature)[0]

    def train_step(
        self, batch: dict[str, torch.Tensor], advantages: torch.Tensor,
        total_rows: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step over a `pack_groups` batch (advantages: one per completion row),
        in micro-batches of whole groups holding about `micro_batch_size` completions each.
        `total_rows`: completions of the whole batch when this is one rank's share of it."""
        n = total_rows or batch["row_group"].shape[0]
        return self.step_on(self.micro_batches(batch, advantages, n))

    def micro_batches(
        self, batch: dict[str, torch.Tensor], advantages: torch.Tensor, total_rows: int
    ) -> list[tuple[dict[str, torch.Tensor], torch.Tensor, float]]:
        """(micro-batch, its advantages, its share of the batch's completions) triples."""
        out = []
        r0 = 0  # rows are in group order, so each micro-batch's rows follow the previous ones
        for g0, g1 in _micro_groups(batch["row_group"], self.cfg.micro_batch_size):
            micro = slice_groups(batch, g0, g1)
            r1 = r0 + micro["row_group"].numel()
            out.append((micro, advantages[r0:r1], (r1 - r0) / total_rows))
            r0 = r1
        return out

    def step_on(
        self, micros: list[tuple[dict[str, torch.Tensor], torch.Tensor, float]]
    ) -> dict[str, float]:
        """Accumulate the weighted gradients of `micros`, clip, and take the optimizer step."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for micro, adv, weight in micros:
            for k, v in self.forward_backward(micro, adv, weight).items():
                totals[k] = totals.get(k, 0.0) + v * weight
        totals = self.sum_over_ranks(totals)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        totals["lr"] = self.scheduler.get_last_lr()[0]
        # the norm and loss are the whole batch's (every rank's), so all ranks decide alike
        finite = math.isfinite(totals.get("loss", 0.0)) and math.isfinite(float(grad_norm))
        totals["update_skipped"] = 0.0 if finite else 1.0
        if finite:
            self.optimizer.step()
        else:
            totals["nonfinite_grads"] = float(self._skip_update(totals, float(grad_norm)))
        self.scheduler.step()  # the schedule follows the run's steps, skipped or not
        self.model.eval()
        totals["grad_norm"] = float(grad_norm)
        return totals

    def _skip_update(self, totals: dict[str, float], grad_norm: float) -> int:
        """Drop this step's gradients without touching the weights or the optimizer's state
        (a NaN that reached AdamW would reach every weight through clipping and the moments);
        returns how many gradient elements (this rank's) were not finite."""
        bad = 0
        for p in self.params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # FSDP shard
                bad += int((~torch.isfinite(g)).sum())
        log_event(log, "update skipped: non-finite loss or gradient norm",
                  loss=totals.get("loss"), grad_norm=grad_norm, nonfinite_grads=bad,
                  params=len(self.params), level=logging.WARNING)
        self.optimizer.zero_grad(set_to_none=True)
        return bad

    def sum_over_ranks(self, totals: dict[str, float]) -> dict[str, float]:
        """Batch metrics from this process's weighted sums (one process: they are the batch's)."""
        return totals

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "optimizer" in state:  # absent when a sharded checkpoint holds it (dcp_checkpoint.py)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _micro_groups(row_group: torch.Tensor, micro_batch_size: int) -> list[tuple[int, int]]:
    """Consecutive group ranges [g0, g1) of at most `micro_batch_size` rows (at least 1 group)."""
    sizes = torch.bincount(row_group).tolist()
    ranges, g0, rows = [], 0, 0
    for g, size in enumerate(sizes):
        if rows and rows + size > micro_batch_size:
            ranges.append((g0, g))
            g0, rows = g, 0
        rows += size
    ranges.append((g0, len(sizes)))
    return ranges
