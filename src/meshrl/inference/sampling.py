"""Replayable sampling: Gumbel-max with noise that is a pure function of (seed, sequence, position).

Sampling `argmax(logits / T + g)` with standard Gumbel noise `g` draws exactly from
`softmax(logits / T)`. Deriving `g` from a counter-based hash instead of a stateful RNG makes
every token checkable: a validator that knows the seed recomputes `g`, recomputes the logits with
one prefill, and checks that the claimed token is (within a floating-point tolerance) the argmax.

Noise derivation (documented in docs/sampling.md, stable across versions and devices):
    m(x)  = 32-bit integer mixer: x ^= x>>16; x *= 0x7FEB352D; x ^= x>>15; x *= 0x846CA68B;
            x ^= x>>16   (all mod 2^32)
    s     = m((seed mod 2^32) ^ m(seed >> 32) ^ 0x9E3779B9)
    key   = m(m(s ^ m(seq_id mod 2^32)) ^ (position mod 2^32))
    h[v]  = m(key ^ m(v + 0x632BE5AB))                       for each vocabulary index v
    u[v]  = (h[v] + 0.5) / 2^32                              (never 0 or 1)
    g[v]  = -log(-log(u[v]))                                 computed in float64
`seq_id` identifies the completion (the caller's choice, e.g. prompt_index * n + completion) and
`position` is the index of the generated token within its completion (0 for the first).
Top-p keeps the smallest prefix of tokens sorted by probability whose mass reaches p (the token
that crosses p included); the rest are masked to -inf before the argmax. Temperature 0 is greedy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from meshrl.inference.native import NativeKernels

__all__ = [
    "BatchSampler",
    "check_sampled_tokens",
    "gumbel_noise",
    "sample_tokens",
    "token_margins",
    "top_p_mask",
]

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # int64 arithmetic on values < 2^32; products may wrap in int64 but their low 32 bits are exact.
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _i64(values: int | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64) & _M32


_vocab_hash_cache: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_hash(vocab_size: int, device: torch.device) -> torch.Tensor:
    key = (vocab_size, str(device))
    if key not in _vocab_hash_cache:
        v = torch.arange(vocab_size, dtype=torch.int64, device=device)
        _vocab_hash_cache[key] = _mix32((v + 0x632BE5AB) & _M32)
    return _vocab_hash_cache[key]


def gumbel_noise(
    seed: int,
    seq_ids: torch.Tensor | list[int],
    positions: torch.Tensor | list[int],
    vocab_size: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Gumbel noise of shape [N, vocab_size] (float64) for N (seq_id, position) pairs."""
    device = torch.device(device)
    seq = torch.as_tensor(seq_ids, dtype=torch.int64, device=device).reshape(-1) & _M32
    pos = torch.as_tensor(positions, dtype=torch.int64, device=device).reshape(-1) & _M32
    if seq.shape != pos.shape:
        raise ValueError(f"seq_ids and positions differ in length: {seq.shape} vs {pos.shape}")
    s = _mix32(_i64(seed & _M32) ^ _mix32(_i64((seed >> 32) & _M32)) ^ 0x9E3779B9).to(device)
    key = _mix32(_mix32(s ^ _mix32(seq)) ^ pos)
    h = _mix32(key[:, None] ^ _vocab_hash(vocab_size, device)[None, :])
    u = (h.to(torch.float64) + 0.5) / 4294967296.0
    return -torch.log(-torch.log(u))


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask [N, V] of the tokens inside the top-p nucleus of softmax(logits).

    The definition is a full descending sort of each row (`_nucleus_by_sort`). This computes the
    same mask from a row's candidates, the tokens of probability >= a threshold (first
    max p / 2^8, then max p / 2^16, then (1 - top_p) / 2V, whose tokens hold at least
    top_p + (1 - top_p) / 2 of the mass), wherever that provably gives the same set; rows of
    over 2,048 candidates sort the last level's candidates one row at a time, and a row none of
    this settles (ties across the cut, NaN) is sorted whole, as defined: sorting
    49,152 probabilities per row cost more than the model's decode step on SmolLM2
    (docs/inference.md).
    """
    if top_p >= 1.0:
        return torch.ones_like(logits, dtype=torch.bool)
    probs = torch.softmax(logits.float(), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    mask, todo = _nucleus_by_candidates(flat, top_p)
    for r in todo.tolist():  # flat rows: sort the candidates of the last level, values only
        row = flat[r]
        threshold = (1.0 - top_p) / (2 * flat.shape[1])
        vals = row[row >= threshold].sort(descending=True).values
        done, last = _nucleus_from_top(torch.cat([vals, vals.new_zeros(1)])[None], top_p)
        mask[r] = row >= last[0] if threshold > 0 and bool(done[0]) else \
            _nucleus_by_sort(row[None], top_p)[0]
    return mask.view(probs.shape)


def _nucleus_by_candidates(flat: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The nucleus mask [R, V] of the rows of probabilities `flat` that their candidates settle,
    and the indices of the rows they do not (left False in the mask)."""
    mask = torch.zeros_like(flat, dtype=torch.bool)
    todo, rest = torch.arange(flat.shape[0]), []
    for level in range(3):
        if not todo.numel():
            break
        sub = flat[todo]
        top = sub.max(-1, keepdim=True).values
        threshold = top * 2.0**-8 if level == 0 else top * 2.0**-16 if level == 1 else \
            torch.full_like(top, (1.0 - top_p) / (2 * flat.shape[1]))
        cand = sub >= threshold
        # a flat row (thousands of candidates) sorts faster alone; later levels only add more
        small = cand.sum(-1) <= _MAX_CANDIDATES
        if not small.all():
            rest.append(todo[~small])
            todo, sub, cand, threshold = todo[small], sub[small], cand[small], threshold[small]
        done, last = _nucleus_from_top(_sorted_candidates(sub, cand), top_p)
        done &= threshold[:, 0] > 0
        mask[todo[done]] = sub[done] >= last[done, None]
        todo = todo[~done]
    return mask, torch.cat([todo, *rest]).sort().values


# rows with more candidates than this are sorted one at a time (top_p_mask)
_MAX_CANDIDATES = 2048


def _sorted_candidates(probs: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """[R, c + 1]: each row's candidate probabilities in descending order, then zeros (c = the
    most candidates of a row; the extra column keeps a zero after every row's last)."""
    rows = cand.nonzero()[:, 0]
    vals = probs[cand]
    order = vals.sort(descending=True, stable=True).indices
    order = order[rows[order].sort(stable=True).indices]  # by row, descending within a row
    counts = cand.sum(-1)
    starts = counts.cumsum(0) - counts
    col = torch.arange(rows.numel()) - starts[rows]
    out = probs.new_zeros(probs.shape[0], int(counts.max()) + 1 if rows.numel() else 1)
    out[rows, col] = vals[order]
    return out


def _nucleus_from_top(vals: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """From each row's largest probabilities (sorted, zero-padded: [R, k]): which rows' nuclei
    they settle, and the smallest kept probability of those rows.

    The sorted values, their cumsum and so the kept positions are those of the full sort (a sort
    orders equal values differently, but the value sequence is the same; the padding comes after
    the row's candidates and every non-candidate is below them). A row is settled when the
    kept positions are a prefix [0, n) with n < k, the value at n - 1 is strictly above the value
    at n (so "p >= that value" names exactly those n tokens, whatever order ties take), and the
    candidates hold top_p + 2^-20 of the mass: every later token's mass_before is then at least
    that minus float32 rounding (< 2^-22), so it is dropped too.
    """
    k = vals.shape[1]
    csum = vals.cumsum(-1)
    keep = (csum - vals) < top_p
    keep[:, 0] = True
    n = keep.sum(-1)
    prefix = (keep == (torch.arange(k)[None, :] < n[:, None])).all(-1)
    last = vals.gather(1, (n - 1)[:, None])[:, 0]
    after = vals.gather(1, n.clamp(max=k - 1)[:, None])[:, 0]
    done = (prefix & (n < k) & (last > after) & (csum[:, -1] >= top_p + 2.0**-20)
            & vals.isfinite().all(-1))
    return done, last


def _nucleus_by_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus by definition: sort each row, keep while the mass before a token is < top_p."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def _scores(logits, seed, seq_ids, positions, temperature, top_p):
    scaled = logits.double() / temperature
    noise = gumbel_noise(seed, seq_ids, positions, logits.shape[-1], logits.device)
    scores = scaled + noise
    if top_p < 1.0:
        scores = scores.masked_fill(~top_p_mask(scaled, top_p), float("-inf"))
    return scores


def _replay_scores(logits, seed, seq_ids, positions, temperature) -> torch.Tensor:
    """The sampler's unmasked scores in float64: logits / T + g (plain logits when greedy)."""
    if temperature == 0:
        return logits.double()
    noise = gumbel_noise(seed, seq_ids, positions, logits.shape[-1], logits.device)
    return logits.double() / temperature + noise


def sample_tokens(
    logits: torch.Tensor,
    seed: int,
    seq_ids: torch.Tensor | list[int],
    positions: torch.Tensor | list[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Pick one token per row of `logits` [N, V]; deterministic given (seed, seq_id, position)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    return _scores(logits, seed, seq_ids, positions, temperature, top_p).argmax(dim=-1)


class BatchSampler:
    """`sample_tokens` for a fixed set of sequences, step after step, bit-identical to it.

    The per-sequence part of the key, m(s ^ m(seq_id)), is computed once instead of at every
    step, which removes most of the small-tensor work from a decode step (tested for equality
    with `gumbel_noise` / `sample_tokens`). With `native` (the engine's kernels) the hashes and
    u come from one native pass (`NativeKernels.gumbel_u`, exact integer arithmetic) instead of
    ~15 int64 [N, V] tensor ops; the two logs stay torch's, on the same values.
    """

    def __init__(
        self,
        seed: int,
        seq_ids: torch.Tensor | list[int],
        vocab_size: int,
        temperature: float,
        top_p: float = 1.0,
        device: torch.device | str = "cpu",
        native: NativeKernels | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"BatchSampler needs temperature > 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        device = torch.device(device)
        seq = torch.as_tensor(seq_ids, dtype=torch.int64, device=device).reshape(-1) & _M32
        s = _mix32(_i64(seed & _M32) ^ _mix32(_i64((seed >> 32) & _M32)) ^ 0x9E3779B9).to(device)
        self.base = _mix32(s ^ _mix32(seq))
        self.vocab = _vocab_hash(vocab_size, device)
        self.temperature, self.top_p = temperature, top_p
        self.native = native if device.type == "cpu" else None

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these sequences (after finished rows leave the batch)."""
        self.base = self.base[rows]

    def noise(self, position: int) -> torch.Tensor:
        """gumbel_noise(seed, seq_ids, [position] * N, vocab_size), bit for bit."""
        if self.native is not None:
            u = self.native.gumbel_u(self.base, position, self.vocab)
        else:
            key = _mix32(self.base ^ (position & _M32))
            h = _mix32(key[:, None] ^ self.vocab[None, :])
            u = (h.to(torch.float64) + 0.5) / 4294967296.0
        return u.log_().neg_().log_().neg_()  # -log(-log(u)), in place: the same kernels

    def sample(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """sample_tokens(logits, seed, seq_ids, [position] * N, temperature, top_p)."""
        scaled = logits.double() / self.temperature
        scores = self.noise(position).add_(scaled)  # scaled + noise (the same sum)
        if self.top_p < 1.0:
            scores.masked_fill_(~top_p_mask(scaled, self.top_p), float("-inf"))
        return scores.argmax(dim=-1)


def token_margins(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    seq_ids: torch.Tensor | list[int],
    positions: torch.Tensor | list[int],
    temperature: float = 1.0,
) -> torch.Tensor:
    """How far (in score units) each claimed token falls below the sampler's argmax; 0 = exact.

    Computed without the top-p mask (the nucleus is checked separately), so a token outside
    the nucleus still gets a finite margin.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.int64, device=logits.device).reshape(-1, 1)
    scores = _replay_scores(logits, seed, seq_ids, positions, temperature)
    return scores.max(dim=-1).values - scores.gather(-1, tokens).squeeze(-1)


def check_sampled_tokens(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    seq_ids: torch.Tensor | list[int],
    positions: torch.Tensor | list[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    tolerance: float = 0.05,
    top_p_slack: float = 0.02,
) -> torch.Tensor:
    """Per-token booleans: is each claimed token what the seeded sampler had to pick?

    A token passes if, among the tokens the (slightly widened) nucleus admits, its score is
    within `tolerance` of the best score: recomputed logits differ from the generator's by
    floating-point noise, so ties closer than that cannot be told apart.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.int64, device=logits.device).reshape(-1, 1)
    if tokens.shape[0] != logits.shape[0]:
        raise ValueError(f"{tokens.shape[0]} tokens for {logits.shape[0]} rows of logits")
    scores = _replay_scores(logits, seed, seq_ids, positions, temperature)
    if top_p < 1.0:
        scaled = logits.double() / max(temperature, 1e-6)
        nucleus = top_p_mask(scaled, min(1.0, top_p + top_p_slack))
        in_nucleus = nucleus.gather(-1, tokens).squeeze(-1)
        strict = top_p_mask(scaled, max(1e-6, top_p - top_p_slack))
        # the best competitor is any token certainly in the nucleus
        scores_best = scores.masked_fill(~strict, float("-inf")).max(dim=-1).values
    else:
        in_nucleus = torch.ones(tokens.shape[0], dtype=torch.bool, device=logits.device)
        scores_best = scores.max(dim=-1).values
    margin = scores_best - scores.gather(-1, tokens).squeeze(-1)
    return in_nucleus & (margin <= tolerance)
