"""Shared-prompt packing: each group's prompt is computed once for all of its completions.

A GRPO group is one prompt with n completions. Padding each completion behind its own copy of
the prompt (the textbook layout) runs the prompt through the model n times. Here a group is one
packed sequence

    [prompt, completion_1, completion_2, ..., completion_n]

with a block attention mask: prompt tokens attend causally within the prompt; a completion's
tokens attend to the prompt and causally within their own completion, never to the other
completions. Position ids restart after the prompt for every completion, so each completion
sees exactly what it would see in its own [prompt, completion] row: the log-probs are the same
numbers (up to float summation order) and so are the gradients, which sum over the completions
at the shared prompt positions. For 2-digit addition (7-token prompts, ~4-token completions,
groups of 8) a step processes ~40 instead of ~88 token positions per group.

The loss side sees one row per completion: `targets`, `loss_mask` and `inference_logprobs` are
[rows, T] over completion tokens only, and `pred_index` says which packed position predicts each
target (the last prompt token predicts every completion's first token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PackCost", "pack_groups", "packed_logprobs", "slice_groups"]


@dataclass(frozen=True)
class PackCost:
    """Relative compute of one packed sequence of length L: token * L + pair * L^2.

    `token` ~ 2 x parameters (the matmuls every position goes through), `pair` ~ 4 x hidden x
    layers (scores and weighted values for every query-key pair: the attention kernel computes
    the whole masked square). A completion joins the current pack when that costs less than
    starting a new pack, which recomputes the prompt but keeps the square small: 8 answers of
    4 tokens behind a 7-token prompt share one pack; 8 completions of 96 tokens get a pack
    each (one pack of 775 positions would cost ~1.7x more than eight of 103).
    """

    token: float
    pair: float

    @classmethod
    def for_model(cls, model: Any) -> PackCost:
        cfg = model.config
        params = sum(p.numel() for p in model.parameters())
        return cls(token=2.0 * params, pair=4.0 * cfg.hidden_size * cfg.num_hidden_layers)

    def append_is_cheaper(self, prompt: int, length: int, completion: int) -> bool:
        append = self.token * completion + self.pair * ((length + completion) ** 2 - length**2)
        fresh = self.token * (prompt + completion) + self.pair * (prompt + completion) ** 2
        return append <= fresh


def pack_groups(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    inference_logprobs: list[list[float]],
    pad_token_id: int,
    cost: PackCost | None = None,
    loss_masks: list[list[bool]] | None = None,
) -> dict[str, torch.Tensor]:
    """Pack rows into groups: consecutive rows with the same prompt share one packed sequence.

    With `cost`, a group is split into several packed sequences where that is cheaper: packing
    saves recomputing the prompt but attention grows with the square of the packed length, so
    long completions are better off in shorter packs (see `PackCost`).

    Returns group tensors `input_ids`, `position_ids` [G, L], `allowed` [G, L, L] (bool,
    query x key) and `group_length` [G] (real tokens), and row tensors `row_group` [R],
    `pred_index`, `targets`, `loss_mask`, `inference_logprobs` [R, T]. Rows keep their order.

    `loss_masks[r]` (an agentic episode's, `meshrl.wire.rollout_file.loss_mask`): which of
    row r's completion tokens the policy sampled; the others (tool outputs) are context the
    model reads but never a target of the loss or of an importance ratio. None: all of them.
    """
    if not (len(prompt_ids) == len(completion_ids) == len(inference_logprobs)) or not prompt_ids:
        raise ValueError("pack_groups needs equally many (>= 1) prompts, completions, log-probs")
    for c, lp in zip(completion_ids, inference_logprobs, strict=True):
        if len(c) != len(lp):
            raise ValueError("every completion token needs one inference log-prob")
    if loss_masks is not None and [len(m) for m in loss_masks] != [len(c) for c in
                                                                   completion_ids]:
        raise ValueError("every completion token needs one loss-mask entry")
    if any(not p for p in prompt_ids):
        raise ValueError("every prompt needs >= 1 token")
    starts: list[int] = []
    lengths: list[int] = []  # of each packed sequence, the last one being filled
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        if (i == 0 or p != prompt_ids[i - 1]
                or (cost is not None and not cost.append_is_cheaper(len(p), lengths[-1], len(c)))):
            starts.append(i)
            lengths.append(len(p))
        lengths[-1] += len(c)
    bounds = list(zip(starts, [*starts[1:], len(prompt_ids)], strict=True))
    g_n, width = len(bounds), max(lengths)
    r_n, t_n = len(prompt_ids), max(1, *(len(c) for c in completion_ids))
    input_ids = torch.full((g_n, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((g_n, width), dtype=torch.long)
    allowed = torch.zeros((g_n, width, width), dtype=torch.bool)
    row_group = torch.zeros(r_n, dtype=torch.long)
    pred_index = torch.zeros((r_n, t_n), dtype=torch.long)
    targets = torch.full((r_n, t_n), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((r_n, t_n), dtype=torch.bool)
    inf_lp = torch.zeros((r_n, t_n), dtype=torch.float32)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for g, (a, b) in enumerate(bounds):
        p = len(prompt_ids[a])
        input_ids[g, :p] = torch.tensor(prompt_ids[a])
        position_ids[g, :p] = torch.arange(p)
        allowed[g, :p, :p] = causal[:p, :p]
        start = p
        for r in range(a, b):
            c = completion_ids[r]
            k, end = len(c), start + len(c)
            input_ids[g, start:end] = torch.tensor(c)
            position_ids[g, start:end] = torch.arange(p, p + k)
            allowed[g, start:end, :p] = True
            allowed[g, start:end, start:end] = causal[:k, :k]
            row_group[r] = g
            pred_index[r, 0] = p - 1  # (an empty completion keeps it, masked out)
            if k > 1:
                pred_index[r, 1:k] = torch.arange(start, end - 1)
            targets[r, :k] = torch.tensor(c)
            loss_mask[r, :k] = True if loss_masks is None else torch.tensor(loss_masks[r],
                                                                              dtype=torch.bool)
            inf_lp[r, :k] = torch.tensor(inference_logprobs[r], dtype=torch.float32)
            start = end
        # padding attends to itself only: no fully masked softmax row (NaN), no effect elsewhere
        allowed[g, range(start, width), range(start, width)] = True
    return {
        "input_ids": input_ids, "position_ids": position_ids, "allowed": allowed,
        "group_length": torch.tensor(lengths), "row_group": row_group,
        "pred_index": pred_index, "targets": targets, "loss_mask": loss_mask,
        "inference_logprobs": inf_lp,
    }


def slice_groups(packed: dict[str, torch.Tensor], g0: int, g1: int) -> dict[str, torch.Tensor]:
    """The groups [g0, g1) and their rows, trimmed to the longest packed sequence among them."""
    rows = ((packed["row_group"] >= g0) & (packed["row_group"] < g1)).nonzero().flatten()
    r0, r1 = int(rows[0]), int(rows[-1]) + 1  # a group's rows are contiguous
    width = int(packed["group_length"][g0:g1].max())
    return {
        "input_ids": packed["input_ids"][g0:g1, :width],
        "position_ids": packed["position_ids"][g0:g1, :width],
        "allowed": packed["allowed"][g0:g1, :width, :width],
        "group_length": packed["group_length"][g0:g1],
        "row_group": packed["row_group"][r0:r1] - g0,
        **{k: packed[k][r0:r1] for k in ("pred_index", "targets", "loss_mask",
                                          "inference_logprobs")},
    }


def _attention_mask(allowed: torch.Tensor, model: Any, dtype: torch.dtype) -> torch.Tensor:
    """[G, 1, L, L] mask in the form the model's attention implementation takes as-is:
    bool (True = attend) for sdpa / flex, additive float (0 / min) for eager."""
    mask = allowed.unsqueeze(1)
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask


def packed_logprobs(
    model: Any, packed: dict[str, torch.Tensor], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [R, T] of each completion token under softmax(logits / T), and the entropy."""
    decoder = model.get_decoder()
    dtype = next(model.parameters()).dtype
    hidden = decoder(
        input_ids=packed["input_ids"],
        attention_mask=_attention_mask(packed["allowed"], model, dtype),
        position_ids=packed["position_ids"],
    ).last_hidden_state
    picked = hidden[packed["row_group"].unsqueeze(-1), packed["pred_index"]]  # [R, T, d]
    logits = model.get_output_embeddings()(picked).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logp.gather(-1, packed["targets"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy
