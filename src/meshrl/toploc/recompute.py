"""Validator-side prefill and a reference worker on plain Hugging Face causal LMs.

`prefill` is what a validator runs: one forward pass over prompt + completion, returning the
final hidden states (after the final norm: HF's `hidden_states[-1]`) and logits at the input
positions that predict each generated token (position len(prompt) - 1 + j for token j), the
same convention as the inference engine. `generate` is a small KV-cache decoder with the
replayable sampler, used as an honest (or, on a perturbed model, dishonest) worker for
calibration and tests; its decode-step activations differ from a prefill by real float noise.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from meshrl.inference.sampling import sample_tokens
from meshrl.toploc.modes import HONEST_MODES

__all__ = ["HONEST_MODES", "Generated", "generate", "prefill", "recompute_mode"]


@dataclass
class Generated:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    seq_id: int
    hidden_states: torch.Tensor  # [n, hidden], the model's dtype
    logits: torch.Tensor  # [n, vocab] float32


def _batch(seqs: Sequence[Sequence[int]], pad_left: bool, pad_to: int = 0):
    width = max(pad_to, max(len(s) for s in seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if pad_left else slice(0, len(s))
        ids[i, sl] = torch.tensor(list(s), dtype=torch.int64)
        mask[i, sl] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


@torch.no_grad()
def prefill(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    batch_size: int = 8,
    pad_left: bool = False,
    pad_to: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden [n, H], logits [n, V] float32) per completion from batched prefills."""
    out = []
    for b in range(0, len(prompts), batch_size):
        ps, cs = prompts[b : b + batch_size], completions[b : b + batch_size]
        seqs = [list(p) + list(c) for p, c in zip(ps, cs, strict=True)]
        ids, mask, pos = _batch(seqs, pad_left, pad_to)
        res = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                    output_hidden_states=True)
        hidden, logits = res.hidden_states[-1], res.logits
        for i, (p, c) in enumerate(zip(ps, cs, strict=True)):
            start = (ids.shape[1] - len(seqs[i]) if pad_left else 0) + len(p) - 1
            sl = slice(start, start + len(c))
            out.append((hidden[i, sl].clone(), logits[i, sl].float().clone()))
    return out


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    seed: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_ids: Sequence[int] = (),
    seq_ids: Sequence[int] | None = None,
) -> list[Generated]:
    """Batched KV-cache decoding (left padding) with the replayable seeded sampler."""
    seq_ids = list(range(len(prompts))) if seq_ids is None else list(seq_ids)
    ids, mask, pos = _batch(prompts, pad_left=True)
    n = len(prompts)
    res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                output_hidden_states=True)
    cache = res.cache
    tokens: list[list[int]] = [[] for _ in range(n)]
    hiddens: list[list[torch.Tensor]] = [[] for _ in range(n)]
    logit_rows: list[list[torch.Tensor]] = [[] for _ in range(n)]
    done = [False] * n
    finish = ["length"] * n
    hidden, logits = res.hidden_states[-1][:, -1], res.logits[:, -1].float()
    next_pos = pos[:, -1] + 1
    for step in range(max_new_tokens):
        tok = sample_tokens(logits, seed, seq_ids, [step] * n, temperature, top_p)
        for i in range(n):
            if done[i]:
                continue
            tokens[i].append(int(tok[i]))
            hiddens[i].append(hidden[i])
            logit_rows[i].append(logits[i])
            if int(tok[i]) in eos_token_ids:
                done[i], finish[i] = True, "eos"
        if all(done) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], dim=-1)
        res = model(input_ids=tok.reshape(n, 1), attention_mask=mask,
                    position_ids=next_pos.reshape(n, 1), cache=cache, use_cache=True,
                    output_hidden_states=True)
        cache, next_pos = res.cache, next_pos + 1
        hidden, logits = res.hidden_states[-1][:, -1], res.logits[:, -1].float()
    out = []
    for i in range(n):
        lg = torch.stack(logit_rows[i])
        t = temperature if temperature > 0 else 1.0
        lp = torch.log_softmax(lg / t, -1).gather(-1, torch.tensor(tokens[i])[:, None])
        out.append(Generated(list(prompts[i]), tokens[i], lp.squeeze(-1).tolist(), finish[i],
                             seq_ids[i], torch.stack(hiddens[i]), lg))
    return out


def _variant(model: torch.nn.Module, fp32: bool, attn: str | None) -> torch.nn.Module:
    if not fp32 and attn is None:
        return model
    out = copy.deepcopy(model)
    if fp32:
        out = out.float()
    if attn is not None:
        out.set_attn_implementation(attn)
    return out


def recompute_mode(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    mode: str,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`prefill` in one of the HONEST_MODES (the model itself is never modified)."""
    if mode not in HONEST_MODES:
        raise ValueError(f"unknown recompute mode {mode!r}; known: {', '.join(HONEST_MODES)}")
    fp32, eager = mode.startswith("fp32"), "eager" in mode
    m = _variant(model, fp32, "eager" if eager else None)
    if mode == "bf16-threads-alt":
        n = torch.get_num_threads()
        torch.set_num_threads(2 if n == 1 else 1)
        try:
            return prefill(m, prompts, completions, batch_size=5)
        finally:
            torch.set_num_threads(n)
    kwargs = {
        "bf16-batch8": dict(batch_size=8),
        "bf16-batch1": dict(batch_size=1),
        "bf16-leftpad-batch16": dict(batch_size=16, pad_left=True, pad_to=200),
        "bf16-eager": dict(batch_size=8),
        "fp32": dict(batch_size=8),
        "fp32-eager-leftpad": dict(batch_size=32, pad_left=True),
        "fp32-batch3": dict(batch_size=3),
    }[mode]
    return prefill(m, prompts, completions, **kwargs)
