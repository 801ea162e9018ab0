# over 400 lines: the engine's prefill, decode loop and weight reload share one KV-cache layout and
#  are read together
"""The CPU rollout engine: batched KV-cache generation, prefill scoring and hot weight reload.

A batch is left-padded so every row writes the same cache slot at each decode step and generated
token j of every row is produced at step j; the per-row differences (RoPE position, padding) are
carried by a position vector and an additive attention bias. Rows that finish stay in the batch
(their outputs are ignored) until the alive fraction drops below `compact_below`, then the batch
and its KV cache are compacted in place so finished rows stop costing compute.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from meshrl.inference.backend import (
    Completion,
    InferenceBackend,
    ScoreResult,
    WeightLoadError,
    check_generate_request,
    check_score_request,
    eos_token_ids,
)
from meshrl.inference.native import (
    NativeKernels,
    NativeUnavailableError,
    NativeWorkspace,
    decode_step_native,
    prepack,
)
from meshrl.inference.params import EngineConfig, SamplingParams
from meshrl.inference.sampling import BatchSampler
from meshrl.inference.transformer import (
    KVCache,
    ModelSpec,
    PackedWeights,
    decode_step,
    forward,
)

__all__ = ["CPUEngine", "EngineConfig"]


# hidden size from which oneDNN's prepacked matmuls beat MKL mm in the decode step (measured in
# benchmarks/README.md, bench_decode_matmul.py)
ONEDNN_MIN_HIDDEN = 256
# a prompt prefix this long shared by a whole batch is prefilled once (EngineConfig.share_prompts)
MIN_SHARED_PREFIX = 4


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """Use n torch threads inside, then restore: tiny kernels lose to thread sync on busy CPUs."""
    before = torch.get_num_threads()
    if n and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n and n != before:
            torch.set_num_threads(before)


def _load_kernels(cfg: EngineConfig) -> NativeKernels | None:
    """The native decode kernels, or None for the torch path ("auto" falls back with a warning)."""
    if cfg.decode_kernels == "torch":
        return None
    try:
        return NativeKernels.load(None if cfg.kernel_cache_dir is None
                                  else Path(cfg.kernel_cache_dir).expanduser())
    except NativeUnavailableError as e:
        if cfg.decode_kernels == "native":
            raise
        from meshrl.log import get_logger

        get_logger("meshrl.inference").warning(f"native decode kernels unavailable ({e}); "
                                               "using the torch decode step")
        return None


def _left_pad(seqs: list[list[int]], width: int | None = None) -> tuple[torch.Tensor, ...]:
    """ids, positions [B, S], attention permission [B, 1, S, S] and pad lengths [B], padded to
    `width` (default: the longest sequence)."""
    lens = torch.tensor([len(s) for s in seqs])
    width = int(lens.max()) if width is None else width
    pad = width - lens
    ids = torch.zeros(len(seqs), width, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.int64)
    col = torch.arange(width)
    positions = (col[None, :] - pad[:, None]).clamp(min=0)
    causal = col[None, :] <= col[:, None]
    # a padding query may see itself, so no softmax row is empty (its output is never used)
    allowed = (causal[None] & (col[None, None, :] >= pad[:, None, None])) | torch.eye(
        width, dtype=torch.bool
    )
    return ids, positions, allowed[:, None], pad


def _common_prefix(seqs: list[list[int]]) -> int:
    """How many leading tokens all of `seqs` share."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def _real_slots(pad: torch.Tensor, width: int) -> torch.Tensor:
    """Flat indices of the non-padding slots of a left-padded [B, width] grid (`forward`'s real)."""
    return (torch.arange(width)[None, :] >= pad[:, None]).reshape(-1).nonzero()[:, 0]


class CPUEngine(InferenceBackend):
    """Default backend: meshrl's own forward over HF Qwen2 / Qwen3 / Llama weights, float32 on
    CPU (a model it cannot run raises `EngineUnsupportedError`: use the reference backend).

    The weights are copied (fused) at construction as policy `version`; call `load_weights` to
    pick up new ones.
    """

    def __init__(self, model: Any, tokenizer: Any = None, cfg: EngineConfig | None = None,
                 version: int = 0) -> None:
        self.cfg = cfg or EngineConfig()
        self.spec = ModelSpec.from_hf_config(model.config)
        self.vocab_size = self.spec.vocab
        self.max_seq_len = min(self.cfg.max_seq_len or self.spec.max_positions,
                               self.spec.max_positions)
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(tokenizer, model.config)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        self.hidden_dtype = getattr(torch, self.cfg.hidden_dtype)
        self.kernels = _load_kernels(self.cfg)
        self._set_weights(model.state_dict(), version)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, cfg: EngineConfig | None = None) -> CPUEngine:
        from meshrl.model import load_model, load_tokenizer

        return cls(load_model(model_dir), load_tokenizer(model_dir), cfg)

    # ---- weights -------------------------------------------------------------------------
    def load_weights(self, source: str | Path | dict[str, torch.Tensor], version: int) -> None:
        """Swap in policy `version`; on any error the engine keeps its current weights."""
        state = _read_checkpoint(Path(source), self.spec) if isinstance(source, str | Path) \
            else source
        self._set_weights(state, version)

    def with_weights(self, state: dict[str, torch.Tensor], version: int) -> CPUEngine:
        """Another engine of the same model and settings at policy `version`, this one
        unchanged: a validator holds several versions without building a model for each."""
        other = copy.copy(self)
        other._set_weights(state, version)
        return other

    def _set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            weights = PackedWeights.pack(self.spec, state)  # raises before anything changes
            packed = prepack(weights, self.cfg.max_batch_size) if (
                self.kernels is not None and self._onednn()) else None
        # one tuple, so a generate running in another thread sees a consistent triple
        self._loaded = (weights, packed, int(version))

    @property
    def weights(self) -> PackedWeights:
        return self._loaded[0]

    @property
    def packed(self) -> Any:
        """oneDNN-prepacked layer weights of the native decode step, or None."""
        return self._loaded[1]

    def _onednn(self) -> bool:
        mode = self.cfg.onednn_weights
        return mode == "on" or (mode == "auto" and self.spec.hidden >= ONEDNN_MIN_HIDDEN)

    # ---- generation ------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seq_ids: list[int] | None = None
    ) -> list[Completion]:
        prompts, seq_ids = check_generate_request(prompts, params, seq_ids, self.spec.vocab,
                                                  self.max_seq_len, self.tokenizer is not None)
        out: list[Completion] = []
        step = self.cfg.max_batch_size
        with _threads(self.cfg.num_threads):
            for lo in range(0, len(prompts), step):
                out += self._generate_batch(
                    prompts[lo : lo + step], seq_ids[lo : lo + step], params
                )
        return out

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[list[int]], seq_ids: list[int], p: SamplingParams
    ) -> list[Completion]:
        w, packed, version = self._loaded  # consistent even if weights are swapped meanwhile
        b = len(prompts)
        lens = torch.tensor([len(x) for x in prompts])
        budget = (self.max_seq_len - lens).clamp(max=p.max_new_tokens)
        steps, width = int(budget.max()), int(lens.max())
        cache = KVCache(self.spec, b, width + steps - 1)  # the last token is never fed back
        h, pad = self._prefill(w, prompts, cache, width)
        live = _LiveRows(torch.arange(b), lens.clone(), budget.clone(),
                         torch.ones(b, dtype=torch.bool), _pad_bias(pad, self.spec, cache), pad)
        ws = None if self.kernels is None else NativeWorkspace.allocate(w, b)
        out = _Outputs(b, steps, self.spec.hidden, self.hidden_dtype if p.return_hidden_states
                       else None, budget.tolist())
        eos = set() if p.ignore_eos else set(self.eos_token_ids)
        stop_ids = torch.tensor(sorted({*p.stop_token_ids} | eos), dtype=torch.int64)
        budget_ends = set(budget.tolist())
        temp = p.temperature if p.temperature > 0 else 1.0
        # same tokens as sample_tokens(logits, seed, seq_ids, j, ...), with per-row work hoisted
        sampler = None if p.temperature == 0 else BatchSampler(
            p.seed, seq_ids, self.spec.vocab, p.temperature, p.top_p, native=self.kernels)
        for j in range(steps):
            logits = h @ w.lm_head
            tok = None if sampler is None else sampler.sample(logits, j)
            picked = None if self.kernels is None else self.kernels.token_logprob(logits, tok,
                                                                                 temp)
            if picked is None:
                tok = logits.argmax(-1) if tok is None else tok
                scaled = logits if temp == 1.0 else logits / temp
                lp = scaled.log_softmax(-1).gather(1, tok[:, None])[:, 0]
            else:
                tok, lp = picked
            out.record(live.index, j, tok, lp, h)
            ended = (tok == stop_ids[0] if len(stop_ids) == 1 else torch.isin(tok, stop_ids))
            if j + 1 in budget_ends:  # a row reaches its length limit (the context) here
                ended |= live.budget <= j + 1
            hit = self._stop_string_hits(out.tokens, live, j, p.stop_strings)
            if hit is not None:
                ended |= hit
            ended &= live.alive
            if ended.any():
                for r in ended.nonzero()[:, 0].tolist():
                    t = int(tok[r])
                    reason = "eos" if t in eos else "stop" if (
                        t in p.stop_token_ids or (hit is not None and bool(hit[r]))) else "length"
                    out.finish(int(live.rows[r]), j + 1, reason)
                live.alive &= ~ended
                n_alive = int(live.alive.sum())
                if n_alive == 0:
                    break
                if n_alive < self.cfg.compact_below * live.alive.numel():
                    keep = live.alive.nonzero()[:, 0]
                    cache.keep_rows(keep)
                    live.keep(keep, self.spec.kv_heads)
                    if sampler is not None:
                        sampler.keep(keep)
                    h, tok = h[keep], tok[keep]
            if j + 1 == steps:
                break
            if ws is None:
                h = decode_step(w, tok, live.pos, cache, width + j, live.bias)
            else:
                h = decode_step_native(self.kernels, w, tok, live.pos, cache, width + j,
                                       live.start, ws, packed=packed)
            live.pos += 1
        return out.completions(prompts, seq_ids, version)

    def _prefill(self, w: PackedWeights, prompts: list[list[int]], cache: KVCache,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill cache slots [0, width) of every row; the last prompt token's final hidden state
        of each row [B, d] and the rows' left padding [B].

        A worker's batch repeats each prompt `group_size` times: each distinct prompt is
        prefilled once, on the same left-padded grid it has in the full batch (same width, same
        positions), and its keys / values and hidden state are copied to the rows repeating it.
        Rows of a prompt are independent in every op of `forward`, so the rows get the values
        the full batch computes (tested: test_grouped_batch_prefills_each_prompt_once).
        """
        first: dict[tuple[int, ...], int] = {}
        src = [first.setdefault(tuple(p), len(first)) for p in prompts]
        if not self.cfg.share_prompts or len(first) == len(prompts):
            src = None
        distinct = prompts if src is None else [list(p) for p in first]
        ids, positions, allowed, pad = _left_pad(distinct, width)
        lens = torch.tensor([len(x) for x in distinct])
        # the prefix all distinct prompts share (a chat template's system turn), prefilled once;
        # each row keeps at least its last token to prefill (its hidden state starts decoding)
        shared = min(_common_prefix(distinct), int(lens.min()) - 1) \
            if self.cfg.share_prompts and len(distinct) > 1 else 0
        if shared >= MIN_SHARED_PREFIX:
            ones = _left_pad([distinct[0][:shared]])
            head = KVCache(self.spec, 1, shared)
            forward(w, ones[0], ones[1], ones[2], head)
            h = forward(w, ids[:, shared:], positions[:, shared:], allowed[:, :, shared:], cache,
                        _real_slots(pad, width - shared), prefix=(head, pad))
            lens = lens - shared
        else:
            h = forward(w, ids, positions, allowed, cache, _real_slots(pad, width))
        # each row's last prompt token is the last of its run in the flat real-token order
        h = h[lens.cumsum(0) - 1]
        if src is None:
            return h, pad
        index = torch.tensor(src)
        n = len(prompts)
        for buf in (cache.k, cache.v):  # the right side is gathered before rows are written
            buf[:, :n, :, :width] = buf[:, index, :, :width]
        return h[index], pad[index]

    def _stop_string_hits(
        self, tokens: torch.Tensor, live: _LiveRows, j: int, stop_strings: tuple[str, ...]
    ) -> torch.Tensor | None:
        if not stop_strings:
            return None
        # decode only a tail window: a stop string is checked as soon as its last token appears,
        # so it lies within the last max-length tokens (every token decodes to >= 1 character)
        window = max(len(s) for s in stop_strings) + 4
        hits = torch.zeros_like(live.alive)
        for r in live.alive.nonzero()[:, 0].tolist():
            tail = tokens[int(live.rows[r]), max(0, j + 1 - window) : j + 1].tolist()
            text = self.tokenizer.decode(tail, skip_special_tokens=True)
            hits[r] = any(s in text for s in stop_strings)
        return hits

    # ---- scoring ---------------------------------------------------------------------------
    @torch.inference_mode()
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]] | list[Completion],
        temperature: float = 1.0,
        return_hidden_states: bool = True,
        return_logits: bool = False,
    ) -> list[ScoreResult]:
        prompts, comps = check_score_request(prompts, completions, temperature, self.spec.vocab,
                                             self.max_seq_len)
        temp = temperature if temperature > 0 else 1.0
        out: list[ScoreResult] = []
        step = self.cfg.max_batch_size
        with _threads(self.cfg.num_threads):
            for lo in range(0, len(prompts), step):
                out += self._score_batch(prompts[lo : lo + step], comps[lo : lo + step], temp,
                                         return_hidden_states, return_logits)
        return out

    def _score_batch(self, prompts, comps, temp, want_hidden, want_logits) -> list[ScoreResult]:
        w = self.weights
        ids, positions, allowed, pad = _left_pad([p + c for p, c in zip(prompts, comps,
                                                                         strict=True)])
        hid = forward(w, ids, positions, allowed, real=_real_slots(pad, ids.shape[1]))
        # completion token j of row i is predicted at real token offset_i + len(prompt) - 1 + j
        offset, parts = 0, []
        for p, c in zip(prompts, comps, strict=True):
            parts.append(offset + len(p) - 1 + torch.arange(len(c)))
            offset += len(p) + len(c)
        h = hid[torch.cat(parts)]
        logits = h @ w.lm_head
        targets = torch.tensor([t for c in comps for t in c], dtype=torch.int64)
        lp = (logits / temp).log_softmax(-1).gather(1, targets[:, None])[:, 0]
        sizes = [len(c) for c in comps]
        hs = h.to(self.hidden_dtype).split(sizes) if want_hidden else [None] * len(comps)
        lg = logits.split(sizes) if want_logits else [None] * len(comps)
        return [
            ScoreResult(logprobs=a.clone(), hidden_states=None if b_ is None else b_.clone(),
                        logits=None if c_ is None else c_.clone())
            for a, b_, c_ in zip(lp.split(sizes), hs, lg, strict=True)
        ]


@dataclass
class _LiveRows:
    """Per-row state of the rows still in the batch (row r came from prompt rows[r])."""

    rows: torch.Tensor
    pos: torch.Tensor  # position of the next token fed back
    budget: torch.Tensor
    alive: torch.Tensor
    bias: torch.Tensor  # [rows * kv_heads, 1, slots]: -inf on each row's left padding
    start: torch.Tensor  # [rows] int64: first cache slot after each row's left padding
    full: bool = True  # rows == arange(batch): write outputs with plain slices

    @property
    def index(self) -> slice | torch.Tensor:
        return slice(None) if self.full else self.rows

    def keep(self, keep: torch.Tensor, kv_heads: int) -> None:
        self.rows, self.pos = self.rows[keep], self.pos[keep]
        self.budget, self.alive = self.budget[keep], self.alive[keep]
        self.start = self.start[keep]
        slots = self.bias.shape[-1]
        self.bias = self.bias.view(-1, kv_heads, 1, slots)[keep].view(-1, 1, slots)
        self.full = False


class _Outputs:
    """Preallocated per-step outputs of a batch: tokens, log-probs, hidden states (optional)."""

    def __init__(self, b: int, steps: int, hidden: int, hidden_dtype: torch.dtype | None,
                 length: list[int]) -> None:
        self.tokens = torch.zeros(b, steps, dtype=torch.int64)
        self.logprobs = torch.zeros(b, steps)
        self.hidden = None if hidden_dtype is None else torch.empty(b, steps, hidden,
                                                                    dtype=hidden_dtype)
        self.length, self.reason = length, ["length"] * b

    def record(self, index, j: int, tok, lp, h) -> None:
        self.tokens[index, j] = tok
        self.logprobs[index, j] = lp
        if self.hidden is not None:
            self.hidden[index, j] = h.to(self.hidden.dtype)

    def finish(self, row: int, length: int, reason: str) -> None:
        self.length[row], self.reason[row] = length, reason

    def completions(self, prompts: list[list[int]], seq_ids: list[int],
                    version: int) -> list[Completion]:
        tok, lp, n = self.tokens.tolist(), self.logprobs.tolist(), self.length
        return [
            Completion(
                prompt_ids=prompts[i], token_ids=tok[i][: n[i]], logprobs=lp[i][: n[i]],
                finish_reason=self.reason[i],  # type: ignore[arg-type]
                seq_id=seq_ids[i], policy_version=version,
                hidden_states=None if self.hidden is None else self.hidden[i, : n[i]].clone(),
            )
            for i in range(len(prompts))
        ]


def _pad_bias(pad: torch.Tensor, spec: ModelSpec, cache: KVCache) -> torch.Tensor:
    slots = cache.k.shape[3]
    bias = torch.zeros(len(pad), spec.kv_heads, 1, slots)
    bias.masked_fill_(torch.arange(slots) < pad[:, None, None, None], float("-inf"))
    return bias.view(-1, 1, slots)


def _read_checkpoint(directory: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """All tensors of a HF model directory's safetensors files, after an architecture check."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not directory.is_dir():
        raise WeightLoadError(f"{directory}: not a directory")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"{directory}: no *.safetensors files")
    if (directory / "config.json").is_file():
        from transformers import AutoConfig

        try:
            other = ModelSpec.from_hf_config(
                AutoConfig.from_pretrained(str(directory), local_files_only=True))
        except (OSError, ValueError) as e:
            raise WeightLoadError(f"{directory}: unusable config.json ({e})") from e
        if other != spec:
            raise WeightLoadError(f"{directory}: architecture {other} differs from {spec}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise WeightLoadError(f"{f}: unreadable safetensors file ({e})") from e
    return state
