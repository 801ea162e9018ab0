"""Rollout generators: the small interface the trainer needs from an inference backend.

The trainer only needs `generate(prompts, params) -> samples` (tokens + their log-probs) and
`load_weights(state_dict)`. `EngineGenerator` adapts meshrl's inference engine; `TorchGenerator`
is a self-contained batched KV-cache loop over any HF causal LM that uses the same replayable
Gumbel sampler (`meshrl.inference.sampling`), so both draw identical tokens for a given seed.
Sampling is a pure function of (seed, seq_id, position): generation never touches a global RNG,
which is what makes asynchronous runs (generation in another thread) reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from meshrl.inference.sampling import sample_tokens

__all__ = ["GenParams", "Generated", "RolloutGenerator", "TorchGenerator", "make_generator"]


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Generated:
    """One completion: sampled token ids and log softmax(logits / T) of each sampled token."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "length"


class RolloutGenerator(Protocol):
    def generate(
        self, prompts: list[list[int]], params: GenParams, seq_ids: list[int]
    ) -> list[Generated]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


class TorchGenerator:
    """Batched sampling with a KV cache: left-padded prompts, one forward per new token."""

    def __init__(self, model: Any, pad_token_id: int, eos_token_id: int) -> None:
        self.model = model.eval()
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: GenParams, seq_ids: list[int]
    ) -> list[Generated]:
        from transformers import DynamicCache

        n = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        done = torch.zeros(n, dtype=torch.bool)
        tokens, logps = [], []
        temp = params.temperature if params.temperature > 0 else 1.0
        for t in range(params.max_new_tokens):
            logits = logits.float()
            tok = sample_tokens(
                logits, params.seed, seq_ids, [t] * n, params.temperature, params.top_p
            )
            lp = torch.log_softmax(logits / temp, -1).gather(-1, tok[:, None])[:, 0]
            tokens.append(torch.where(done, self.pad_token_id, tok))
            logps.append(lp)
            done = done | (tok == self.eos_token_id)
            if bool(done.all()) or t + 1 == params.max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            logits = self.model(
                input_ids=tok[:, None], attention_mask=mask, position_ids=pos, cache=cache,
                use_cache=True,
            ).logits[:, -1]
        tok_mat = torch.stack(tokens, 1).tolist()
        lp_mat = torch.stack(logps, 1).tolist()
        out = []
        for toks, lps in zip(tok_mat, lp_mat, strict=True):
            if self.eos_token_id in toks:
                k = toks.index(self.eos_token_id) + 1
                out.append(Generated(toks[:k], lps[:k], "eos"))
            else:
                out.append(Generated(toks, lps, "length"))
        return out


def make_generator(backend: str, model: Any, tokenizer: Any) -> RolloutGenerator:
    """The rollout generator for `backend` ("torch" or "engine") over its own `model` copy."""
    if backend == "torch":
        return TorchGenerator(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    if backend == "engine":
        from meshrl.rl.engine_adapter import EngineGenerator

        return EngineGenerator(model, tokenizer)
    raise ValueError(f"unknown rollout backend {backend!r} (expected 'torch' or 'engine')")
