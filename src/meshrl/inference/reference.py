"""The reference backend: the naive Hugging Face loop behind the inference contract.

One forward of the HF model per generated token (left-padded batch, HF's KV cache), the same
replayable sampler and stopping rules as the engine, and `score` as one HF prefill. It is the
one decode loop outside the fast engine: tests check `CPUEngine` against it token for token, it
is the fallback backend, and TOPLOC validators recompute with its `score` (its batching and
padding, `ReferenceConfig`, vary the float noise the way honest validators do).

It runs the model as given, on the model's device and in its dtype (a bf16 model gives bf16
hidden states; `meshrl.inference.device.place` puts a model on `cpu` / `cuda:N` in float32,
bfloat16 or float16), and shares that model: `load_weights` writes into it. Inputs go to the
model's device, the sampler draws there (its noise is the same on every device), and results
(tokens, log-probs, hidden states, logits) come back on the CPU, so callers never see a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from meshrl.inference.backend import (
    Completion,
    FinishReason,
    InferenceBackend,
    ScoreResult,
    WeightLoadError,
    check_generate_request,
    check_score_request,
    eos_token_ids,
)
from meshrl.inference.params import ReferenceConfig, SamplingParams
from meshrl.inference.sampling import sample_tokens

__all__ = ["ReferenceBackend"]


def _pad(seqs: Sequence[list[int]], left: bool, width: int = 0,
         device: torch.device | None = None) -> tuple[torch.Tensor, ...]:
    """ids, attention mask and position ids [B, W] of `seqs` padded to at least `width`, on
    `device`."""
    width = max(width, max(len(s) for s in seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, cols] = torch.tensor(s, dtype=torch.int64)
        mask[i, cols] = 1
    ids, mask = ids.to(device or "cpu"), mask.to(device or "cpu")
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


class ReferenceBackend(InferenceBackend):
    """`generate`, `score` and `load_weights` on any HF causal LM, one forward per token."""

    def __init__(self, model: Any, tokenizer: Any = None, cfg: ReferenceConfig | None = None,
                 version: int = 0) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cfg = cfg or ReferenceConfig()
        self.version = int(version)
        self.eos_token_ids = eos_token_ids(tokenizer, model.config)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        self.vocab = self.vocab_size = int(model.config.vocab_size)
        self.max_seq_len = int(model.config.max_position_embeddings)
        first = next(iter(model.parameters()), None)
        self.device = first.device if first is not None else torch.device("cpu")

    # ---- weights ---------------------------------------------------------------------------
    def load_weights(self, source: str | Path | dict[str, torch.Tensor], version: int) -> None:
        """Copy policy `version` into the model; keys and shapes are checked before any copy."""
        if isinstance(source, str | Path):
            source = _read_model_dir(Path(source))
        own = self.model.state_dict()
        unexpected = sorted(set(source) - set(own))
        missing = sorted(set(own) - set(source) - self._tied())
        wrong = [k for k, v in source.items() if k in own and v.shape != own[k].shape]
        if unexpected or missing or wrong:
            raise WeightLoadError(f"weights do not fit the model: unexpected {unexpected[:3]}, "
                                  f"missing {missing[:3]}, wrong shape {wrong[:3]}")
        head = source.get("lm_head.weight") if self._tied() else None
        embed = source.get("model.embed_tokens.weight")  # the HF name in Qwen2 / Llama
        if head is not None and embed is not None and not torch.equal(head, embed):
            raise WeightLoadError("lm_head.weight differs from the embedding it is tied to")
        with torch.no_grad():  # load_state_dict copies into the model's device and dtype
            self.model.load_state_dict(source, strict=False)
        self.version = int(version)

    def _tied(self) -> set[str]:
        """Keys a state dict may leave out because they share the input embedding."""
        return {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) \
            else set()

    # ---- generation ------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seq_ids: list[int] | None = None
    ) -> list[Completion]:
        prompts, seq_ids = check_generate_request(prompts, params, seq_ids, self.vocab,
                                                  self.max_seq_len, self.tokenizer is not None)
        step, out = self.cfg.max_batch_size, []
        for lo in range(0, len(prompts), step):
            out += self._generate_batch(prompts[lo : lo + step], seq_ids[lo : lo + step], params)
        return out

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], seq_ids: list[int], p: SamplingParams
    ) -> list[Completion]:
        n, want_hidden = len(prompts), p.return_hidden_states
        budget = [min(p.max_new_tokens, self.max_seq_len - len(x)) for x in prompts]
        ids, mask, pos = _pad(prompts, left=True, device=self.device)
        res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         output_hidden_states=want_hidden, logits_to_keep=1)
        rows = [_Row(prompts[i], seq_ids[i], budget[i]) for i in range(n)]
        temp = p.temperature if p.temperature > 0 else 1.0
        for j in range(max(budget)):
            logits = res.logits[:, -1].float()
            tok = sample_tokens(logits, p.seed, seq_ids, [j] * n, p.temperature, p.top_p)
            lps = (logits / temp).log_softmax(-1).gather(1, tok[:, None])[:, 0].tolist()
            hidden = res.hidden_states[-1][:, -1].cpu() if want_hidden else None
            for i, (r, t) in enumerate(zip(rows, tok.tolist(), strict=True)):
                if r.reason is None:
                    r.add(t, lps[i], None if hidden is None else hidden[i])
                    r.reason = self._finished(r, p)
            if all(r.reason is not None for r in rows):
                break
            mask = torch.cat([mask, mask.new_ones(n, 1)], dim=1)
            pos = pos[:, -1:] + 1
            res = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                             cache=res.cache, use_cache=True, output_hidden_states=want_hidden)
        return [r.completion(self.version, want_hidden) for r in rows]

    def _finished(self, row: _Row, p: SamplingParams) -> FinishReason | None:
        """Why `row` ends after its latest token, or None while it goes on."""
        t = row.tokens[-1]
        if t in self.eos_token_ids and not p.ignore_eos:
            return "eos"
        if t in p.stop_token_ids:
            return "stop"
        if p.stop_strings:
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            if any(s in text for s in p.stop_strings):
                return "stop"
        return "length" if len(row.tokens) == row.budget else None

    # ---- scoring ---------------------------------------------------------------------------
    @torch.no_grad()
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]] | list[Completion],
        temperature: float = 1.0,
        return_hidden_states: bool = True,
        return_logits: bool = False,
    ) -> list[ScoreResult]:
        prompts, comps = check_score_request(prompts, completions, temperature, self.vocab,
                                             self.max_seq_len)
        temp = temperature if temperature > 0 else 1.0
        left, step, out = self.cfg.score_padding == "left", self.cfg.max_batch_size, []
        for lo in range(0, len(prompts), step):
            ps, cs = prompts[lo : lo + step], comps[lo : lo + step]
            seqs = [p + c for p, c in zip(ps, cs, strict=True)]
            ids, mask, pos = _pad(seqs, left, self.cfg.score_pad_to, self.device)
            res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                             output_hidden_states=return_hidden_states)
            for i, (p, c) in enumerate(zip(ps, cs, strict=True)):
                # completion token j is predicted at input position len(prompt) - 1 + j
                start = (ids.shape[1] - len(seqs[i]) if left else 0) + len(p) - 1
                cols = slice(start, start + len(c))
                logits = res.logits[i, cols].float()
                target = torch.tensor(c, dtype=torch.int64, device=logits.device)[:, None]
                lp = (logits / temp).log_softmax(-1).gather(1, target)[:, 0].cpu()
                hidden = res.hidden_states[-1][i, cols].cpu().clone() \
                    if return_hidden_states else None
                out.append(ScoreResult(lp, hidden, logits.cpu().clone() if return_logits
                                       else None))
        return out


class _Row:
    """One completion being generated."""

    def __init__(self, prompt: list[int], seq_id: int, budget: int) -> None:
        self.prompt, self.seq_id, self.budget = prompt, seq_id, budget
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.hidden: list[torch.Tensor] = []
        self.reason: FinishReason | None = None

    def add(self, token: int, logprob: float, hidden: torch.Tensor | None) -> None:
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if hidden is not None:
            self.hidden.append(hidden)

    def completion(self, version: int, want_hidden: bool) -> Completion:
        assert self.reason is not None  # every row ends by its budget at the latest
        return Completion(self.prompt, self.tokens, self.logprobs, self.reason, self.seq_id,
                          version, torch.stack(self.hidden) if want_hidden else None)


def _read_model_dir(directory: Path) -> dict[str, torch.Tensor]:
    """The state dict of the HF model directory `directory`, or a `WeightLoadError`."""
    from meshrl.model import load_model

    if not (directory / "config.json").is_file():
        raise WeightLoadError(f"{directory}: no model directory (config.json missing)")
    try:
        return load_model(directory).state_dict()
    except (OSError, ValueError) as e:
        raise WeightLoadError(f"{directory}: unreadable model directory ({e})") from e
