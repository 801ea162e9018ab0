"""Held-out evaluation: greedy decoding on a fixed set of problems the trainer never sees, and
optionally pass@k from sampled completions (the unbiased estimator of Chen et al. 2021:
1 - C(n-c, k) / C(n, k) for c correct of n samples, averaged over problems)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meshrl.inference import InferenceBackend, SamplingParams
from meshrl.pool import PromptFormat, encode_prompt
from meshrl.rl.config import EvalCommandConfig, EvalConfig
from meshrl.tasks import TaskSet

__all__ = ["evaluate", "evaluate_checkpoint", "heldout_problems", "pass_at_k",
           "resolve_model_dir"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct among `n` samples (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def heldout_problems(tasks: TaskSet, cfg: EvalConfig) -> list[Any]:
    """`cfg.num_problems` distinct problems from the held-out seed (deterministic)."""
    from meshrl.tasks import sample_problems

    seen: dict[str, Any] = {}
    for counter in range(256):
        for p in sample_problems(tasks, cfg.seed, "heldout", 0, counter, cfg.num_problems,
                                 heldout=True):
            seen.setdefault(p.prompt, p)
        if len(seen) >= cfg.num_problems:
            break
    return list(seen.values())[: cfg.num_problems]


def evaluate(
    backend: InferenceBackend,
    tokenizer: Any,
    problems: list[Any],
    tasks: TaskSet,
    cfg: EvalConfig,
    prompt_format: PromptFormat = "raw",
    tools: bool = True,
) -> dict[str, float]:
    """Greedy accuracy (mean verifier score) and mean completion length on `problems`, and
    `pass@k` for each of `cfg.pass_k`. A task with tools answers in episodes
    (`meshrl.pool.episode`); `tools=False`: in one turn, a call never answered (the same
    model without its tools)."""
    from meshrl.pool.episode import episode_of, run_episodes
    from meshrl.tasks import compute_reward

    correct, tokens = 0.0, 0
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0)
    for start in range(0, len(problems), cfg.batch_size):
        chunk = problems[start : start + cfg.batch_size]
        prompts = [encode_prompt(tokenizer, p.prompt, prompt_format) for p in chunk]
        outs = run_episodes(backend, tokenizer, prompts,
                            [episode_of(tasks, p) if tools else None for p in chunk], params, 0)
        for p, o in zip(chunk, outs, strict=True):
            text = tokenizer.decode(o.tokens)
            correct += compute_reward(p, text, len(o.tokens), tasks).task
            tokens += len(o.tokens)
    n = max(1, len(problems))
    out = {"accuracy": correct / n, "mean_tokens": tokens / n, "n": float(len(problems))}
    if cfg.pass_k:
        out.update(_pass_k(backend, tokenizer, problems, tasks, cfg, prompt_format))
    return out


def _pass_k(backend: InferenceBackend, tokenizer: Any, problems: list[Any], tasks: TaskSet,
            cfg: EvalConfig, prompt_format: PromptFormat) -> dict[str, float]:
    """pass@k for each k of `cfg.pass_k` from `cfg.samples()` sampled completions a problem
    (a completion is correct when its verifier score is 1.0), prompts encoded as the greedy
    accuracy's are."""
    from meshrl.tasks import compute_reward

    s = cfg.samples()
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.pass_temperature,
                            seed=cfg.pass_seed)
    totals = dict.fromkeys(cfg.pass_k, 0.0)
    per_batch = max(1, cfg.batch_size // s)
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        prompts = [encode_prompt(tokenizer, p.prompt, prompt_format)
                   for p in chunk for _ in range(s)]
        outs = backend.generate(prompts, params, seq_ids=[start * s + i
                                                          for i in range(len(prompts))])
        for j, p in enumerate(chunk):
            c = sum(compute_reward(p, tokenizer.decode(o.token_ids), len(o.token_ids),
                                   tasks).task == 1.0 for o in outs[j * s:(j + 1) * s])
            for k in cfg.pass_k:
                totals[k] += pass_at_k(s, c, k)
    n = max(1, len(problems))
    return {f"pass@{k}": total / n for k, total in totals.items()}



def resolve_model_dir(path: str | Path) -> Path:
    """A model directory from a model dir, a trainer checkpoint dir, or a run dir (latest)."""
    from meshrl.model import ModelNotFoundError
    from meshrl.rl.checkpoint import latest_checkpoint

    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"model directory {path} does not exist")
    if (path / "config.json").is_file():
        return path
    if (path / "model" / "config.json").is_file():
        return path / "model"
    latest = latest_checkpoint(path / "checkpoints")
    if latest is None:
        raise ModelNotFoundError(f"{path}: no model directory, checkpoint or run with checkpoints")
    return latest / "model"


def evaluate_checkpoint(cfg: EvalCommandConfig) -> dict[str, Any]:
    """Load the model `cfg.checkpoint` points at and evaluate it on the held-out set."""
    import torch

    from meshrl.inference import ReferenceBackend
    from meshrl.model import load_model, load_tokenizer

    torch.set_num_threads(cfg.threads)
    tasks = cfg.tasks.build()  # first: a bad task is refused before a model is loaded
    model_dir = resolve_model_dir(cfg.checkpoint)
    model = load_model(model_dir)  # first: its family check names a model meshrl cannot use
    tokenizer = load_tokenizer(model_dir)
    backend = ReferenceBackend(model, tokenizer)
    result = evaluate(backend, tokenizer, heldout_problems(tasks, cfg.eval), tasks, cfg.eval,
                      cfg.prompt_format, cfg.tools)
    return {"model": str(model_dir), **result}
