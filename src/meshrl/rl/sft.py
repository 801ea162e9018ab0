"""Supervised warm-start: cross-entropy on correct answers until held-out accuracy reaches a cap.

RL needs a policy that is sometimes right (a group whose completions are all wrong has zero
advantage). The warm-start trains on reference answers and stops as soon as greedy held-out
accuracy reaches `target_accuracy`; it never hands RL a policy above `max_accuracy`: when an
evaluation overshoots, the last snapshot at or below the cap is restored.

Its progress survives a stop: a Ctrl-C (or SIGTERM) saves the weights, optimizer, schedule,
step and best snapshot to `progress` (`<run>/warm_start/`; an optimizer update in progress is
finished first), and the next `meshrl train` continues from the next step (problems are drawn by
step, so it sees what an unstopped run would). A finished warm start is kept there too, so a run
stopped before its first RL checkpoint does not warm-start again.
"""

from __future__ import annotations

import contextlib
import copy
import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from meshrl.durable import atomic_write, replace
from meshrl.pool import PromptFormat, encode_prompt
from meshrl.rl.config import SFTConfig
from meshrl.rl.rollouts import collate, draw_problems
from meshrl.tasks import TaskSet

__all__ = ["SFTConfig", "saved_progress", "warm_start"]

STATE, INFO = "state.pt", "progress.json"


def saved_progress(directory: Path | None) -> dict[str, Any] | None:
    """{"step", "done"} of the warm start saved in `directory`, or None."""
    if directory is None or not (directory / INFO).is_file() \
            or not (directory / STATE).is_file():
        return None
    return json.loads((directory / INFO).read_text())


def _save(directory: Path, info: dict[str, Any], state: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (STATE + ".tmp")
    torch.save(state, tmp)
    replace(tmp, directory / STATE)
    atomic_write(directory / INFO, json.dumps(info))  # last: names a complete state file


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C / SIGTERM held until the block ends (an optimizer update is never half applied
    when the progress is saved); then raised as KeyboardInterrupt. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda n, _f: held.append(n)) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if held:
        raise KeyboardInterrupt


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
    progress: Path | None = None,
    resume: bool = True,
) -> dict[str, float]:
    """Train `model` in place; returns {"steps", "accuracy", "loss"} of the policy handed to RL.

    `evaluate_fn(step)` returns held-out accuracy; `on_eval(step, accuracy, loss)` observes it.
    `progress`: the directory its progress is saved in when stopped, and the finished warm start
    (continued from there when `resume`).
    """
    if cfg.max_steps == 0:
        return {"steps": 0.0, "accuracy": evaluate_fn(0), "loss": float("nan")}
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    warm = cfg.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warm + 1)))
    saved = saved_progress(progress) if resume else None
    if saved is not None:
        assert progress is not None
        state = torch.load(progress / STATE, weights_only=False)
        model.load_state_dict(state["model"])
        if saved["done"]:
            return state["best"]
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        best_state = state["best_state"] or copy.deepcopy(model.state_dict())
        best, done, loss_value = state["best"], int(saved["step"]), state["loss"]
    else:
        best_state = copy.deepcopy(model.state_dict())
        best = {"steps": 0.0, "accuracy": evaluate_fn(0), "loss": float("nan")}
        done, loss_value = 0, float("nan")
    try:
        for step in range(done + 1, cfg.max_steps + 1):
            problems = draw_problems(tasks, seed, "sft", step, cfg.batch_size, exclude)
            model.train()
            loss = sft_loss(model, sft_batch(tokenizer, problems, prompt_format, tasks))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with _uninterrupted():
                opt.step()
                sched.step()
                done, loss_value = step, float(loss.detach())
            model.eval()
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
    except KeyboardInterrupt:
        if progress is not None:
            with _uninterrupted():  # a second Ctrl-C does not cut the file short
                current = best["steps"] == done  # the best snapshot is the weights: not twice
                _save(progress, {"step": done, "done": False}, {
                    "model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "best": best, "loss": loss_value,
                    "best_state": None if current else best_state})
        raise
    model.load_state_dict(best_state)
    if progress is not None:
        _save(progress, {"step": done, "done": True}, {"model": model.state_dict(), "best": best})
    return best
