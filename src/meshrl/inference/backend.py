"""The one inference contract: what the trainer, workers and validators call.

A backend is a class with exactly the three methods of `InferenceBackend`; two exist:
`meshrl.inference.engine.CPUEngine` (the fast one) and `meshrl.inference.reference.
ReferenceBackend` (the naive Hugging Face loop: the fallback, and what tests check the engine
against token for token). Conventions every backend keeps:
- `hidden_states[j]` / `logits[j]` are taken at the input position whose output predicts
  generated token j (position len(prompt) - 1 + j); a hidden state is the final-norm output,
  i.e. the input of the LM head.
- token j of completion i is drawn by `meshrl.inference.sampling.sample_tokens` with
  seq_id = seq_ids[i] (default: i) and position = j, so validators can replay it.
- `logprobs[j]` = log softmax(logits / T)[token j], with T = 1 when sampling is greedy (T = 0).
- a completion ends on EOS ("eos", unless `ignore_eos`: any of `eos_token_ids`, e.g. Qwen's
  `<|im_end|>` and `<|endoftext|>`), on a stop token or stop string
  ("stop"), or at `max_new_tokens` or the end of the context ("length"); the token that ended
  it is included.
- every completion carries the policy version its weights were loaded with.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from meshrl.inference.params import SamplingParams

if TYPE_CHECKING:  # no torch import here: `meshrl --help` stays fast
    import torch

__all__ = [
    "Completion",
    "EngineUnsupportedError",
    "FinishReason",
    "InferenceBackend",
    "InferenceError",
    "InvalidRequestError",
    "ScoreResult",
    "WeightLoadError",
    "check_generate_request",
    "check_score_request",
    "eos_token_ids",
]


class InferenceError(ValueError):
    """Base of the inference backends' errors."""


class InvalidRequestError(InferenceError):
    """A generate / score request that cannot be served (empty prompt, too long, bad token...)."""


class EngineUnsupportedError(InferenceError):
    """A model the fast engine cannot run (its architecture, RoPE type, biases...): the one-line
    reason says what; the reference backend runs it instead."""


class WeightLoadError(InferenceError):
    """Weights that do not fit the backend's model: missing or unexpected keys, wrong shapes."""


FinishReason = Literal["eos", "stop", "length"]


@dataclass
class Completion:
    """One generated completion: the one result type of every backend's `generate`.

    The EOS / stop token that ended it is included in token_ids.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    seq_id: int
    policy_version: int  # the version passed to the backend's last `load_weights`
    hidden_states: torch.Tensor | None = None  # [len(token_ids), hidden] when asked for


@dataclass
class ScoreResult:
    """Prefill scores of one completion given its prompt."""

    logprobs: torch.Tensor  # [n] float32
    hidden_states: torch.Tensor | None = None  # [n, hidden]
    logits: torch.Tensor | None = None  # [n, vocab] float32


class InferenceBackend(ABC):
    """Generation, prefill scoring and hot weight reload, as every backend provides them.

    The two model backends also say what they can score: token ids in `[0, vocab_size)`, at
    most `max_seq_len` prompt + completion tokens per sequence (`check_score_request`)."""

    vocab_size: int
    max_seq_len: int

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seq_ids: list[int] | None = None
    ) -> list[Completion]:
        """One completion per prompt, in order."""

    @abstractmethod
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]] | list[Completion],
        temperature: float = 1.0,
        return_hidden_states: bool = True,
        return_logits: bool = False,
    ) -> list[ScoreResult]:
        """Log-probs (and hidden states / logits) of each completion token after its prompt."""

    @abstractmethod
    def load_weights(self, source: str | Path | dict[str, torch.Tensor], version: int) -> None:
        """Replace the policy weights (model directory or HF state dict) with policy `version`;
        on any error (checked before anything changes) the backend keeps its weights."""


def eos_token_ids(tokenizer: Any, config: Any) -> tuple[int, ...]:
    """The tokens that end a completion with "eos": the tokenizer's `eos_token_ids` (every
    stop token of the model directory, `meshrl.model.HFTokenizer`), its `eos_token_id`, or
    without a tokenizer the model config's `eos_token_id` (an int or a list)."""
    if tokenizer is not None:
        ids = getattr(tokenizer, "eos_token_ids", None) or (tokenizer.eos_token_id,)
    else:
        eos = getattr(config, "eos_token_id", None)
        ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (eos,)
    return tuple(dict.fromkeys(int(t) for t in ids if t is not None))


# ---- request checks shared by the backends --------------------------------------------------
def _ints(values: Any, what: str) -> list[int]:
    """Python ints from a list / tuple / 1-D tensor / array of integers."""
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise InvalidRequestError(f"{what}: expected a sequence of integers") from None


def _ids(values: Any, what: str, vocab: int) -> list[int]:
    """Token ids as a list of Python ints inside the vocabulary, or a clear error."""
    out = _ints(values, what)
    bad = [t for t in out if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(
            f"{what}: token ids {bad[:5]} outside the vocabulary [0, {vocab})")
    return out


def check_generate_request(
    prompts: Sequence[Any], params: SamplingParams, seq_ids: Sequence[int] | None, vocab: int,
    max_seq_len: int, has_tokenizer: bool,
) -> tuple[list[list[int]], list[int]]:
    """Validated (prompts, seq_ids) of a `generate` call, or an `InvalidRequestError`."""
    out = [_ids(p, f"prompt {i}", vocab) for i, p in enumerate(prompts)]
    ids = list(range(len(out))) if seq_ids is None else _ints(seq_ids, "seq_ids")
    for i, p in enumerate(out):
        if len(p) == 0:
            raise InvalidRequestError(f"prompt {i} is empty")
        if len(p) >= max_seq_len:
            raise InvalidRequestError(
                f"prompt {i} has {len(p)} tokens; the context holds {max_seq_len}, "
                f"so at most {max_seq_len - 1} leave room to generate")
    if len(ids) != len(out):
        raise InvalidRequestError(f"{len(ids)} seq_ids for {len(out)} prompts")
    if any(s < 0 for s in ids):
        raise InvalidRequestError("seq_ids must be non-negative integers")
    _ids(params.stop_token_ids, "stop_token_ids", vocab)
    if params.stop_strings and not has_tokenizer:
        raise InvalidRequestError("stop_strings need a tokenizer")
    if any(s == "" for s in params.stop_strings):
        raise InvalidRequestError("stop_strings may not contain an empty string")
    return out, ids


def check_score_request(
    prompts: Sequence[Any], completions: Sequence[Any], temperature: float, vocab: int,
    max_seq_len: int,
) -> tuple[list[list[int]], list[list[int]]]:
    """Validated (prompts, completion token ids) of a `score` call, or an `InvalidRequestError`."""
    if len(completions) != len(prompts):
        raise InvalidRequestError(f"{len(completions)} completions for {len(prompts)} prompts")
    if temperature < 0:
        raise InvalidRequestError(f"temperature must be >= 0, got {temperature}")
    ps = [_ids(p, f"prompt {i}", vocab) for i, p in enumerate(prompts)]
    cs = [_ids(c.token_ids if isinstance(c, Completion) else c, f"completion {i}", vocab)
          for i, c in enumerate(completions)]
    for i, (p, c) in enumerate(zip(ps, cs, strict=True)):
        if len(p) == 0:
            raise InvalidRequestError(f"prompt {i} is empty")
        if len(p) + len(c) > max_seq_len:
            raise InvalidRequestError(
                f"sequence {i} has {len(p) + len(c)} tokens; the context holds {max_seq_len}")
    return ps, cs
