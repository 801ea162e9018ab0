"""The inference backend interface: what workers, validators and the trainer code against.

The CPU engine (`meshrl.inference.engine.CPUEngine`) is the default implementation; a vLLM
backend for GPUs implements the same three methods. Conventions every backend keeps:
- `hidden_states[j]` / `logits[j]` are taken at the input position whose output predicts
  generated token j (position len(prompt) - 1 + j); a hidden state is the final-norm output,
  i.e. the input of the LM head.
- token j of completion i is drawn by `meshrl.inference.sampling.sample_tokens` with
  seq_id = seq_ids[i] (default: i) and position = j, so validators can replay it.
- `logprobs[j]` = log softmax(logits / T)[token j], with T = 1 when sampling is greedy (T = 0).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from meshrl.config import Config

__all__ = [
    "Completion",
    "InferenceBackend",
    "InferenceError",
    "InvalidRequestError",
    "SamplingParams",
    "ScoreResult",
]


class InferenceError(ValueError):
    """Base of the inference engine's errors."""


class InvalidRequestError(InferenceError):
    """A generate / score request that cannot be served (empty prompt, too long, bad token...)."""


class SamplingParams(Config):
    """How to sample one batch. The tokenizer's EOS always stops a completion."""

    max_new_tokens: int = Field(64, ge=1, description="tokens to generate at most per prompt")
    temperature: float = Field(1.0, ge=0.0, description="softmax temperature; 0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept before sampling")
    seed: int = Field(0, ge=0, lt=2**64, description="seed of the replayable Gumbel noise")
    stop_token_ids: tuple[int, ...] = Field((), description="extra token ids that end a completion")
    stop_strings: tuple[str, ...] = Field((), description="strings that end a completion")
    return_hidden_states: bool = Field(False, description="return final hidden states (bf16)")


FinishReason = Literal["eos", "stop", "length"]


@dataclass
class Completion:
    """One generated completion. A stop token / EOS that ended it is included in token_ids."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    seq_id: int
    hidden_states: torch.Tensor | None = None  # [len(token_ids), hidden]


@dataclass
class ScoreResult:
    """Prefill scores of one completion given its prompt."""

    logprobs: torch.Tensor  # [n] float32
    hidden_states: torch.Tensor | None = None  # [n, hidden]
    logits: torch.Tensor | None = None  # [n, vocab] float32


class InferenceBackend(ABC):
    """Generation, prefill scoring and hot weight reload, as every backend provides them."""

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seq_ids: list[int] | None = None
    ) -> list[Completion]:
        """One completion per prompt, in order."""

    @abstractmethod
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        temperature: float = 1.0,
        return_hidden_states: bool = True,
        return_logits: bool = False,
    ) -> list[ScoreResult]:
        """Log-probs (and hidden states / logits) of each completion token after its prompt."""

    @abstractmethod
    def load_weights(self, source: str | Path | dict[str, torch.Tensor]) -> None:
        """Replace the policy weights (model directory or HF state dict); shapes are checked."""
