"""Supervised warm-start: cross-entropy on correct answers until held-out accuracy reaches a cap.

RL needs a policy that is sometimes right (a group whose completions are all wrong has zero
advantage). The warm-start trains on reference answers and stops as soon as greedy held-out
accuracy reaches `target_accuracy`; it never hands RL a policy above `max_accuracy`: when an
evaluation overshoots, the last snapshot at or below the cap is restored.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from meshrl.pool import PromptFormat, encode_prompt
from meshrl.rl.config import SFTConfig
from meshrl.rl.rollouts import collate, draw_problems
from meshrl.tasks import TaskSet

__all__ = ["SFTConfig", "warm_start"]


def sft_batch(tokenizer: Any, problems: list[Any], prompt_format: PromptFormat = "raw",
              tasks: TaskSet | None = None) -> dict[str, torch.Tensor]:
    """Prompt + answer + EOS rows; `loss_mask` covers the answer and EOS tokens. Prompts are
    encoded as the rollouts' are (`prompt_format`). A task with tools and a
    `warm_start_trace` (`tasks`) gives tool-use traces instead: its model turns with the real
    tool outputs between them, the loss on the model's tokens only."""
    from meshrl.pool.episode import episode_of, trace_tokens

    prompts = [encode_prompt(tokenizer, p.prompt, prompt_format) for p in problems]
    answers, masks = [], []
    for p in problems:
        task = episode_of(tasks, p) if tasks is not None else None
        if task is not None and hasattr(task, "warm_start_trace"):
            ids, mask = trace_tokens(task, tokenizer, task.warm_start_trace(p))
        else:
            ids = [*tokenizer.encode(p.answer), tokenizer.eos_token_id]
            mask = [True] * len(ids)
        answers.append(ids)
        masks.append(mask)
    zeros = [[0.0] * len(a) for a in answers]
    return collate(prompts, answers, zeros, tokenizer.pad_token_id, masks)


def sft_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1][batch["loss_mask"]].float()
    targets = batch["input_ids"][:, 1:][batch["loss_mask"]]
    return torch.nn.functional.cross_entropy(logits, targets)


def warm_start(
    model: Any,
    tokenizer: Any,
    cfg: SFTConfig,
    tasks: TaskSet,
    evaluate_fn: Callable[[int], float],
    seed: int,
    exclude: frozenset[str] = frozenset(),
    on_eval: Callable[[int, float, float], None] | None = None,
    prompt_format: PromptFormat = "raw",
) -> dict[str, float]:
    """Train `model` in place; returns {"steps", "accuracy", "loss"} of the policy handed to RL.

    `evaluate_fn(step)` returns held-out accuracy; `on_eval(step, accuracy, loss)` observes it.
    """
    if cfg.max_steps == 0:
        return {"steps": 0.0, "accuracy": evaluate_fn(0), "loss": float("nan")}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    warm = cfg.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warm + 1)))
    best_state = copy.deepcopy(model.state_dict())
    best = {"steps": 0.0, "accuracy": evaluate_fn(0), "loss": float("nan")}
    loss_value = float("nan")
    for step in range(1, cfg.max_steps + 1):
        problems = draw_problems(tasks, seed, "sft", step, cfg.batch_size, exclude)
        model.train()
        loss = sft_loss(model, sft_batch(tokenizer, problems, prompt_format, tasks))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.eval()
        loss_value = float(loss.detach())
        if step % cfg.eval_every and step != cfg.max_steps:
            continue
        acc = evaluate_fn(step)
        if on_eval is not None:
            on_eval(step, acc, loss_value)
        if acc > cfg.max_accuracy:
            break  # overshoot: hand RL the last snapshot at or below the cap
        best_state = copy.deepcopy(model.state_dict())
        best = {"steps": float(step), "accuracy": acc, "loss": loss_value}
        if acc >= cfg.target_accuracy:
            break
    model.load_state_dict(best_state)
    return best
