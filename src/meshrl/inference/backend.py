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
from typing import TYPE_CHECKING, Literal

from meshrl.inference.params import SamplingParams

if TYPE_CHECKING:  # no torch import here: `meshrl --help` stays fast
    import torch

__all__ = [
    "Completion",
    "InferenceBackend",
    "InferenceError",
    "InvalidRequestError",
    "ScoreResult",
]


class InferenceError(ValueError):
    """Base of the inference engine's errors."""


class InvalidRequestError(InferenceError):
    """A generate / score request that cannot be served (empty prompt, too long, bad token...)."""


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
