# over 400 lines: the TOPLOC proof: encode, decode and verify one wire format (bit-compatible with
#  the reference)
"""TOPLOC proofs: commit to the top-k final hidden states of each chunk of generated tokens.

Follows the public description (arXiv 2501.16007) and the wire format of the existing TOPLOC
library: per chunk of `chunk_size` decoded tokens, take the `topk` entries of largest absolute
value of the flattened chunk, and interpolate the polynomial over GF(65497) through the points
(flat index mod m, bf16 bit pattern), m being the largest modulus <= 65497 that keeps the k
indices distinct. A proof is `>u2 m` followed by k `>u2` coefficients (ascending degree).

Wire-compatible with the reference (toploc 0.1.6) by default, checked byte for byte and
statistic for statistic against its vectors (`tests/toploc/vectors/`): the same
chunking (a short last chunk for a token count that is not a multiple of `chunk_size`), the
same top-k selection including its tie choice (torch.topk on |value|, see `_select`), the same
verifier statistics (exponent mismatches, mean and upper-median mantissa error).

Departures, all on purpose and none visible on the wire:
- Every input dtype (bf16, fp16, fp32, fp64) is first rounded to bf16; selection and comparison
  both work on those bf16 values, so a fp32 validator and a bf16 worker compare like with like
  (the reference compares fp32 mantissas against bf16 ones).
- Sign flips among exponent-matched entries are reported too (`sign_mismatches`; the reference
  ignores the sign), and the verdict bounds them.
- Bad input never crashes and never passes: `verify_proofs` returns a `ChunkResult` with a
  `reason` for a malformed proof, a missing or extra proof, a short chunk or non-finite values.
- A chunk with fewer values than `topk` (a 1-token last chunk at hidden size 64) commits to
  all of its n values: the polynomial through those n points, its coefficients above degree
  n - 1 zero, so the proof keeps its 2 + 2 * topk bytes (the reference refuses such a chunk).
- Everything is vectorised over chunks (see `gf.py`) and runs on one thread (`proof_threads`).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from meshrl.toploc import gf

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_TOPK",
    "ChunkResult",
    "ProofError",
    "build_proofs",
    "build_proofs_many",
    "chunk_lengths",
    "find_moduli",
    "proof_from_base64",
    "proof_threads",
    "proof_to_base64",
    "to_bf16_bits",
    "verify_proofs",
    "verify_proofs_many",
]

DEFAULT_CHUNK_SIZE = 32
DEFAULT_TOPK = 128
_EXP_MASK = 0x7F80
_MOD_BLOCK = 64
_PROOF_BLOCK = 512  # chunks interpolated at once (the product tree's temporaries grow with it)


class ProofError(ValueError):
    """Activations or proofs that cannot be turned into / checked against a commitment."""


@dataclass(frozen=True)
class ChunkResult:
    """How far one chunk's recomputed top-k values are from the committed ones.

    exp_mismatches: top-k entries whose exponent bits differ (an index the worker did not
    commit to evaluates to a pseudo-random value, so a different top-k set shows up here too).
    mant_err_mean / mant_err_median: |mantissa difference| (bf16 units of 2^-7) over the
    `n_matched` entries whose exponents agree (`n_exact` of them bit-exact); the median is the
    upper one (element n // 2 of the sorted errors); inf when there are none. These three are
    the reference's statistics, value for value.
    sign_mismatches: exponent-matched entries whose sign differs (not in the reference).
    reason: why the chunk could not be checked at all (malformed proof, ...); None otherwise.
    n_values: values in the chunk (tokens x hidden; 0: not recorded); a chunk with few values
    per committed entry is judged by the small-chunk thresholds (`meshrl.toploc.thresholds`).
    """

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    n_matched: int = 0
    n_exact: int = 0
    reason: str | None = None
    sign_mismatches: int = 0
    n_values: int = 0

    @property
    def n_compared(self) -> int:
        """Committed entries compared (matched + exponent mismatches)."""
        return self.n_matched + max(self.exp_mismatches, 0)


def to_bf16_bits(activations: torch.Tensor | np.ndarray) -> torch.Tensor:
    """bf16 bit patterns (as int16) of `activations` [tokens, hidden] given in any float dtype."""
    if isinstance(activations, np.ndarray):
        activations = torch.from_numpy(np.ascontiguousarray(activations))
    if not isinstance(activations, torch.Tensor):
        raise ProofError(f"activations must be a tensor, got {type(activations).__name__}")
    if activations.dim() != 2:
        shape = tuple(activations.shape)
        raise ProofError(f"activations must be [tokens, hidden], got shape {shape}")
    if not activations.is_floating_point():
        raise ProofError(f"activations must be floating point, got {activations.dtype}")
    a = activations.detach().cpu()
    if a.dtype != torch.bfloat16:
        a = a.float().to(torch.bfloat16)  # round to nearest even, as the worker's bf16 would
    return a.contiguous().view(torch.int16)


def chunk_lengths(n_tokens: int, chunk_size: int) -> list[int]:
    """Tokens per chunk: whole chunks of `chunk_size`, then the remainder as a short last chunk
    ([32] * 31 + [8] for 1000 tokens), exactly as the reference TOPLOC library chunks."""
    n_full, rest = divmod(n_tokens, chunk_size)
    return [chunk_size] * n_full + ([rest] if rest else [])


def _chunk_bits(bits: torch.Tensor, chunk_size: int) -> list[torch.Tensor]:
    """Flattened chunks grouped by length: [whole chunks as one [C, L] batch, short last chunk]."""
    n_full = bits.shape[0] // chunk_size
    groups = []
    if n_full:
        groups.append(bits[: n_full * chunk_size].reshape(n_full, -1))
    if n_full * chunk_size < bits.shape[0]:
        groups.append(bits[n_full * chunk_size :].reshape(1, -1))
    return groups


def _select(flat: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by |value| per row: (flat indices [C, k], bit patterns [C, k] as int64).

    `flat` holds int16 bf16 bit patterns; with the sign bit cleared they order exactly like
    |value| (NaN and inf above every finite value). The selection is torch.topk on those
    magnitudes, the same CPU kernel and the same comparisons as the reference's
    `chunk.abs().topk(k)`, so ties at the k-th magnitude resolve to the same indices (the tie
    rule of docs/toploc.md; bytes pinned against the reference's vectors by the tests).
    """
    idx = (flat & 0x7FFF).topk(min(topk, flat.shape[-1]), dim=-1).indices
    return idx, flat.gather(-1, idx).to(torch.int64) & 0xFFFF


def _nonfinite(bits: torch.Tensor) -> torch.Tensor:
    return (bits & _EXP_MASK) == _EXP_MASK


def find_moduli(idx: torch.Tensor) -> torch.Tensor:
    """Per row of idx [C, k]: largest m <= 65497 keeping idx mod m distinct, else ProofError."""
    k = idx.shape[-1]
    moduli = torch.full(idx.shape[:1], gf.P, dtype=torch.int64)
    todo = (idx.max(-1).values >= gf.P).nonzero().flatten()  # smaller indices need no search
    top = gf.P
    while todo.numel():
        if top < max(k, 1):
            raise ProofError(f"no modulus keeps the {k} top-k indices distinct")
        cand = torch.arange(top, max(top - _MOD_BLOCK, k - 1), -1, dtype=torch.int64)
        r = (idx[todo].unsqueeze(-1) % cand).sort(dim=1).values  # [n, k, block]
        ok = (r[:, 1:] != r[:, :-1]).all(dim=1)  # [n, block]
        found = ok.any(dim=1)
        first = ok.int().argmax(dim=1)
        moduli[todo[found]] = cand[first[found]]
        todo = todo[~found]
        top -= _MOD_BLOCK
    return moduli


def _encode(moduli: torch.Tensor, coeffs: torch.Tensor, topk: int) -> list[bytes]:
    if coeffs.shape[-1] < topk:  # a chunk of fewer values: higher coefficients are zero
        coeffs = torch.nn.functional.pad(coeffs, (0, topk - coeffs.shape[-1]))
    rows = torch.cat([moduli.unsqueeze(-1), coeffs], dim=-1).numpy().astype(">u2")
    return [row.tobytes() for row in rows]


def _check_inputs(chunk_size: int, topk: int) -> None:
    if chunk_size < 1 or topk < 1:
        raise ProofError(f"chunk_size and topk must be >= 1, got {chunk_size} and {topk}")


@contextmanager
def proof_threads() -> Iterator[None]:
    """Run proof work on one intra-op thread, restoring the caller's count afterwards.

    Proof kernels are small (a few ms per 1000 tokens): two OpenMP threads gain little when a
    core is free and lose 20-35x when another process holds one, since each parallel region
    then waits for a descheduled thread. Workers and validators also generate on the same
    cores, so one thread is the steady choice (docs/toploc.md; benchmarks/bench_toploc.py).
    """
    n = torch.get_num_threads()
    if n != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n != 1:
            torch.set_num_threads(n)


def build_proofs(
    activations: torch.Tensor | np.ndarray,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[bytes]:
    """One proof (2 + 2 * topk bytes) per chunk of activations [tokens, H] (see `chunk_lengths`).

    Raises ProofError on anything that cannot be committed to honestly: no tokens or
    non-finite values. A chunk of fewer than `topk` values commits to all of them.
    """
    return build_proofs_many([activations], chunk_size, topk)[0]


def build_proofs_many(
    activations: Sequence[torch.Tensor | np.ndarray],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[list[bytes]]:
    """`build_proofs` of each of `activations` (one per completion), the same bytes, with the
    chunks of all of them selected and interpolated together: one set of tensor operations per
    chunk size instead of one per completion (a file of 128 completions of 8 tokens is 128
    one-chunk calls otherwise, and their per-call overhead was twice the generation's cost).
    Every step is per chunk (top-k per row, exact field arithmetic), so batching changes no byte.
    """
    _check_inputs(chunk_size, topk)
    bits = [to_bf16_bits(a) for a in activations]
    if any(b.shape[0] == 0 for b in bits):
        raise ProofError("no activations to commit to")
    # chunks of one length (values per chunk) are one top-k; (completion, first chunk) each
    by_len: dict[int, list[tuple[int, int, torch.Tensor]]] = defaultdict(list)
    for r, b in enumerate(bits):
        pos = 0
        for flat in _chunk_bits(b, chunk_size):
            by_len[flat.shape[-1]].append((r, pos, flat))
            pos += flat.shape[0]
    out: list[list[bytes]] = [[b""] * len(chunk_lengths(b.shape[0], chunk_size)) for b in bits]
    with proof_threads():
        by_k: dict[int, list[tuple[list[tuple[int, int]], torch.Tensor, torch.Tensor]]] = \
            defaultdict(list)
        for parts in by_len.values():
            idx, vals = _select(torch.cat([flat for _, _, flat in parts]), topk)
            if _nonfinite(vals).any():  # NaN / inf outrank every finite |value|: no full scan
                raise ProofError("activations contain NaN or inf")
            places = [(r, pos + j) for r, pos, flat in parts for j in range(flat.shape[0])]
            by_k[idx.shape[-1]].append((places, idx, vals))
        for groups in by_k.values():
            places = [p for g in groups for p in g[0]]
            idx = torch.cat([g[1] for g in groups])
            vals = torch.cat([g[2] for g in groups])
            for start in range(0, idx.shape[0], _PROOF_BLOCK):  # bounded temporaries
                i, v = idx[start:start + _PROOF_BLOCK], vals[start:start + _PROOF_BLOCK]
                moduli = find_moduli(i)
                coeffs = gf.interpolate(i % moduli.unsqueeze(-1), v)
                for (r, c), proof in zip(places[start:start + _PROOF_BLOCK],
                                         _encode(moduli, coeffs, topk), strict=True):
                    out[r][c] = proof
    return out


def proof_to_base64(proof: bytes) -> str:
    """Text form of a proof for JSON / Parquet string columns."""
    return base64.b64encode(proof).decode("ascii")


def proof_from_base64(text: str) -> bytes:
    """Inverse of `proof_to_base64`; ProofError on malformed base64."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, AttributeError) as e:
        raise ProofError(f"malformed base64 proof: {e}") from None


def _decode_all(proofs: list, topk: int) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """(moduli [n], coefficients [n, k], reason or None per proof); malformed rows are zeros."""
    size = 2 + 2 * topk
    reasons: list[str | None] = []
    raw: list[bytes] = []
    for proof in proofs:
        reason = None
        if isinstance(proof, str):
            try:
                proof = proof_from_base64(proof)
            except ProofError as e:
                reason = str(e)
        elif not isinstance(proof, bytes | bytearray | memoryview):
            reason = f"proof must be bytes, got {type(proof).__name__}"
        if reason is None and len(proof) != size:
            reason = f"proof has {len(proof)} bytes, expected {size} for topk={topk}"
        reasons.append(reason)
        raw.append(bytes(proof) if reason is None else bytes(size))
    words = np.frombuffer(b"".join(raw), dtype=">u2").reshape(-1, topk + 1).astype(np.int64)
    moduli, coeffs = words[:, 0], words[:, 1:]
    for i in np.flatnonzero((moduli < topk) | (moduli > gf.P)):
        if reasons[i] is None:
            reasons[i] = f"proof modulus {moduli[i]} outside [{topk}, {gf.P}]"
    for i in np.flatnonzero((coeffs >= gf.P).any(-1)):
        if reasons[i] is None:
            reasons[i] = f"proof coefficient >= {gf.P}"
    return moduli, coeffs, reasons


def _failed(reason: str) -> ChunkResult:
    return ChunkResult(exp_mismatches=-1, mant_err_mean=math.inf, mant_err_median=math.inf,
                       reason=reason)


def _compare(own: torch.Tensor, claimed: torch.Tensor, valid: torch.Tensor,
             n_values: list[int]) -> list[ChunkResult]:
    """Per-row statistics of claimed vs recomputed bf16 bit patterns, both [C, k], as the
    reference computes them: exponent bits compared, |mantissa difference| over the entries
    whose exponents agree, mean and upper median (the element at n // 2 when sorted).
    `valid` [C, k] marks the committed entries (all but the padding of a chunk of fewer than
    k values); `n_values` is each chunk's value count."""
    mismatch = (((own ^ claimed) & _EXP_MASK) != 0) & valid
    matched = ~mismatch & valid
    sign = (((own ^ claimed) & 0x8000) != 0) & matched
    err = ((own & 0x7F) - (claimed & 0x7F)).abs()
    n = matched.sum(-1)
    exact = ((err == 0) & matched).sum(-1)
    total = err.masked_fill(~matched, 0).sum(-1)
    ranked = err.masked_fill(~matched, 1 << 8).sort(-1).values  # mismatches sort last
    median = ranked.gather(-1, (n // 2).clamp(max=own.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    out = []
    rows = zip(mismatch.sum(-1).tolist(), total.tolist(), median.tolist(), n.tolist(),
               exact.tolist(), sign.sum(-1).tolist(), n_values, strict=True)
    for m, t, med, c, z, sg, nv in rows:
        if c == 0:
            out.append(ChunkResult(m, math.inf, math.inf, 0, 0, sign_mismatches=sg, n_values=nv))
        else:
            out.append(ChunkResult(m, t / c, float(med), c, z, sign_mismatches=sg, n_values=nv))
    return out


def verify_proofs(
    activations: torch.Tensor | np.ndarray,
    proofs: list[bytes] | list[str],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[ChunkResult]:
    """Check proofs against recomputed activations [tokens, hidden]: one ChunkResult per chunk.

    The list has max(#chunks, #proofs) entries; chunks without a proof and proofs without a
    chunk get a `reason`. Proofs may be bytes or base64 text.
    """
    return verify_proofs_many([(activations, proofs)], chunk_size, topk)[0]


def verify_proofs_many(
    items: Sequence[tuple[torch.Tensor | np.ndarray, list[bytes] | list[str]]],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[list[ChunkResult]]:
    """`verify_proofs` of each (activations, proofs) of `items` (one per completion), the same
    results, with the claimed values of every completion's chunks evaluated and compared
    together (the validator's path: the replayed rows of a file at once)."""
    _check_inputs(chunk_size, topk)
    out: list[list[ChunkResult | None]] = []
    claims: list[tuple[int, list[int], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                       list[int]]] = []
    with proof_threads():
        for r, (activations, proofs) in enumerate(items):
            try:
                bits = to_bf16_bits(activations)
            except ProofError as e:
                out.append([_failed(f"bad activations: {e}") for _ in range(max(1, len(proofs)))])
                continue
            n_chunks = len(chunk_lengths(bits.shape[0], chunk_size))
            results: list[ChunkResult | None] = [None] * max(n_chunks, len(proofs))
            for i in range(n_chunks, len(proofs)):
                results[i] = _failed(f"proof {i} has no chunk: {len(proofs)} proofs for "
                                     f"{n_chunks} chunks")
            for i in range(len(proofs), n_chunks):
                results[i] = _failed(f"chunk {i} has no proof: {len(proofs)} proofs for "
                                     f"{n_chunks} chunks")
            moduli, coeffs, reasons = _decode_all(list(proofs[:n_chunks]), topk)
            got = _recompute_claims(bits, chunk_size, topk, moduli, coeffs, reasons, results)
            if got is not None:  # chunks with a checkable proof
                claims.append((r, *got))
            out.append(results)
        if claims:  # one evaluation and one comparison for every checkable chunk
            where = [(r, i) for r, ids, *_ in claims for i in ids]
            own = torch.cat([c[2] for c in claims])
            xs = torch.cat([c[3] for c in claims])
            cf = torch.cat([c[4] for c in claims])
            valid = torch.cat([c[5] for c in claims])
            sizes = [n for c in claims for n in c[6]]
            for start in range(0, len(where), _PROOF_BLOCK):  # bounded temporaries
                end = start + _PROOF_BLOCK
                claimed = gf.evaluate(cf[start:end], xs[start:end])
                stats = _compare(own[start:end], claimed, valid[start:end], sizes[start:end])
                for (r, i), res in zip(where[start:end], stats, strict=True):
                    out[r][i] = res
    return out  # type: ignore[return-value]


def _recompute_claims(bits, chunk_size, topk, moduli, coeffs, reasons, results):
    """Own top-k of every chunk that has a well-formed proof, and where to evaluate its proof:
    (chunk ids, own bit patterns [n, k], evaluation points [n, k], the proofs' coefficients
    [n, k], committed-entry mask [n, k], values per chunk), or None when no chunk has one;
    other chunks get their failure written into `results`. A chunk of fewer than k values is
    padded (index 0, masked out)."""
    n_proofs = len(reasons)
    start, chunk_ids, picked, values, masks, sizes = 0, [], [], [], [], []
    for flat in _chunk_bits(bits, chunk_size):
        ids = list(range(start, min(start + flat.shape[0], n_proofs)))
        start += flat.shape[0]
        if not ids:
            continue
        idx, own = _select(flat[: len(ids)], topk)
        mask = torch.ones(idx.shape[0], topk, dtype=torch.bool)
        if idx.shape[-1] < topk:
            mask[:, idx.shape[-1]:] = False
            pad = (0, topk - idx.shape[-1])
            idx, own = torch.nn.functional.pad(idx, pad), torch.nn.functional.pad(own, pad)
        bad_values = _nonfinite(own).any(-1).tolist()
        good = []
        for row, i in enumerate(ids):
            if reasons[i] is not None:
                results[i] = _failed(f"chunk {i}: {reasons[i]}")
            elif bad_values[row]:
                results[i] = _failed(f"chunk {i}: recomputed activations contain NaN or inf")
            else:
                good.append(row)
        rows = torch.tensor(good, dtype=torch.int64)
        chunk_ids += [ids[row] for row in good]
        picked.append(idx[rows])
        values.append(own[rows])
        masks.append(mask[rows])
        sizes += [flat.shape[-1]] * len(good)
    if not chunk_ids:
        return None
    xs = torch.cat(picked) % torch.from_numpy(moduli[chunk_ids]).unsqueeze(-1)
    return (chunk_ids, torch.cat(values), xs, torch.from_numpy(coeffs[chunk_ids]),
            torch.cat(masks), sizes)
