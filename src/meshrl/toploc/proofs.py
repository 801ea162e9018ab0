"""TOPLOC proofs: commit to the top-k final hidden states of each chunk of generated tokens.

Follows the public description (arXiv 2501.16007) and the wire format of the existing TOPLOC
library: per chunk of `chunk_size` decoded tokens, take the `topk` entries of largest absolute
value of the flattened chunk, and interpolate the polynomial over GF(65497) through the points
(flat index mod m, bf16 bit pattern), m being the largest modulus <= 65497 that keeps the k
indices distinct. A proof is `>u2 m` followed by k `>u2` coefficients (ascending degree).

Departures from the reference implementation, all on purpose:
- Every input dtype (bf16, fp16, fp32, fp64) is first rounded to bf16; selection and comparison
  both work on those bf16 values, so a fp32 validator and a bf16 worker compare like with like
  (the reference compares fp32 mantissas against bf16 ones).
- Top-k ties are broken by the lower flat index, so equal bf16 values select the same indices on
  both sides (torch.topk leaves ties unspecified).
- A sign flip counts as a mismatch together with the exponent (the reference ignores the sign).
- Bad input never crashes and never passes: `verify_proofs` returns a `ChunkResult` with a
  `reason` for a malformed proof, a missing or extra proof, a short chunk or non-finite values.
- Everything is vectorised over chunks (see `gf.py`); there is no per-point Python loop.
"""

from __future__ import annotations

import base64
import binascii
import math
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
    "find_moduli",
    "proof_from_base64",
    "proof_to_base64",
    "to_bf16_bits",
    "verify_proofs",
]

DEFAULT_CHUNK_SIZE = 32
DEFAULT_TOPK = 128
_EXP_MASK = 0x7F80
_MOD_BLOCK = 64


class ProofError(ValueError):
    """Activations or proofs that cannot be turned into / checked against a commitment."""


@dataclass(frozen=True)
class ChunkResult:
    """How far one chunk's recomputed top-k values are from the committed ones.

    exp_mismatches: top-k entries whose sign or exponent differs (an index the worker did not
    commit to evaluates to a pseudo-random value, so a different top-k set shows up here too).
    mant_err_mean / mant_err_median: |mantissa difference| (bf16 units of 2^-7) over the
    `n_matched` entries whose sign and exponent agree (`n_exact` of them bit-exact); inf when
    there are none.
    reason: why the chunk could not be checked at all (malformed proof, ...); None otherwise.
    """

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    n_matched: int = 0
    n_exact: int = 0
    reason: str | None = None


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


def _chunk_bits(bits: torch.Tensor, chunk_size: int) -> list[torch.Tensor]:
    """Flattened chunks grouped by length: [full chunks as one [C, L] batch, last partial chunk]."""
    n_tok, hidden = bits.shape
    n_full = n_tok // chunk_size
    groups = []
    if n_full:
        groups.append(bits[: n_full * chunk_size].reshape(n_full, chunk_size * hidden))
    if n_tok % chunk_size:
        groups.append(bits[n_full * chunk_size :].reshape(1, -1))
    return groups


_SEG = 1 << 16
_REV = torch.arange(_SEG - 1, -1, -1, dtype=torch.int32)  # 65535 - index within a segment


def _select(flat: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by |value| with ties to the lower index: (flat indices [C, k], bit patterns [C, k]).

    `flat` holds int16 bf16 bit patterns; |value| orders like the pattern without its sign bit
    (< 2^15), so (magnitude << 16 | 65535 - index) is an int32 key whose order is exactly "larger
    |value|, then lower index" within a segment of 2^16 values. Longer chunks take the top-k of
    each segment, then the top-k of those candidates under an int64 key with the global index.
    """
    rows, length = flat.shape
    n_seg = -(-length // _SEG)
    seg = min(length, _SEG)
    # bf16 -> fp32 is exact and puts the 16 bits on top; abs clears the sign: mag << 16 in one pass
    mag = flat.view(torch.bfloat16).float().abs_().view(torch.int32)
    if n_seg * seg == length:
        key = mag.view(rows, n_seg, seg)
    else:
        key = torch.full((rows, n_seg * seg), -1, dtype=torch.int32)  # padding ranks last
        key[:, :length] = mag
        key = key.view(rows, n_seg, seg)
    key = key.bitwise_or_(_REV[:seg])
    if n_seg == 1:
        idx = key[:, 0].topk(topk, dim=-1, sorted=False).indices
    else:
        cand_key, cand = key.topk(min(topk, seg), dim=-1, sorted=False)  # [rows, n_seg, k]
        glob = cand + torch.arange(n_seg).unsqueeze(-1) * _SEG
        key64 = ((cand_key >> 16).to(torch.int64) << 32) - glob
        pick = key64.flatten(1).topk(topk, dim=-1, sorted=False).indices
        idx = glob.flatten(1).gather(-1, pick)
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


def _encode(moduli: torch.Tensor, coeffs: torch.Tensor) -> list[bytes]:
    rows = torch.cat([moduli.unsqueeze(-1), coeffs], dim=-1).numpy().astype(">u2")
    return [row.tobytes() for row in rows]


def _check_inputs(chunk_size: int, topk: int) -> None:
    if chunk_size < 1 or topk < 1:
        raise ProofError(f"chunk_size and topk must be >= 1, got {chunk_size} and {topk}")


def build_proofs(
    activations: torch.Tensor | np.ndarray,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    topk: int = DEFAULT_TOPK,
) -> list[bytes]:
    """One proof (2 + 2 * topk bytes) per chunk of `chunk_size` rows of activations [tokens, H].

    Raises ProofError on anything that cannot be committed to honestly: no tokens, non-finite
    values, or a chunk with fewer than `topk` values.
    """
    _check_inputs(chunk_size, topk)
    bits = to_bf16_bits(activations)
    if bits.shape[0] == 0:
        raise ProofError("no activations to commit to")
    proofs: list[bytes] = []
    for flat in _chunk_bits(bits, chunk_size):
        if flat.shape[-1] < topk:
            raise ProofError(f"a chunk has {flat.shape[-1]} values, fewer than topk={topk}")
        idx, vals = _select(flat, topk)
        if _nonfinite(vals).any():  # NaN / inf outrank every finite |value|: no full scan
            raise ProofError("activations contain NaN or inf")
        moduli = find_moduli(idx)
        coeffs = gf.interpolate(idx % moduli.unsqueeze(-1), vals)
        proofs.extend(_encode(moduli, coeffs))
    return proofs


def proof_to_base64(proof: bytes) -> str:
    """Text form of a proof for JSON / Parquet string columns."""
    return base64.b64encode(proof).decode("ascii")


def proof_from_base64(text: str) -> bytes:
    """Inverse of `proof_to_base64`; ProofError on malformed base64."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, AttributeError) as e:
        raise ProofError(f"malformed base64 proof: {e}") from None


def _decode(proof: object, topk: int) -> tuple[int, np.ndarray] | str:
    """(modulus, coefficients) of a proof, or the reason it is malformed."""
    if isinstance(proof, str):
        try:
            proof = proof_from_base64(proof)
        except ProofError as e:
            return str(e)
    if not isinstance(proof, bytes | bytearray | memoryview):
        return f"proof must be bytes, got {type(proof).__name__}"
    proof = bytes(proof)
    if len(proof) != 2 + 2 * topk:
        return f"proof has {len(proof)} bytes, expected {2 + 2 * topk} for topk={topk}"
    words = np.frombuffer(proof, dtype=">u2").astype(np.int64)
    modulus, coeffs = int(words[0]), words[1:]
    if not topk <= modulus <= gf.P:
        return f"proof modulus {modulus} outside [{topk}, {gf.P}]"
    if (coeffs >= gf.P).any():
        return f"proof coefficient >= {gf.P}"
    return modulus, coeffs


def _failed(reason: str) -> ChunkResult:
    return ChunkResult(exp_mismatches=-1, mant_err_mean=math.inf, mant_err_median=math.inf,
                       reason=reason)


def _compare(own: torch.Tensor, claimed: torch.Tensor) -> list[ChunkResult]:
    """Per-row statistics of claimed vs recomputed bf16 bit patterns, both [C, k]."""
    mismatch = (own >> 7) != (claimed >> 7)  # sign + exponent bits
    err = ((own & 0x7F) - (claimed & 0x7F)).abs().double()
    n = (~mismatch).sum(-1)
    exact = ((err == 0) & ~mismatch).sum(-1)
    total = err.masked_fill(mismatch, 0).sum(-1)
    ranked = err.masked_fill(mismatch, math.inf).sort(-1).values
    lo = ranked.gather(-1, ((n - 1).clamp(min=0) // 2).unsqueeze(-1)).squeeze(-1)
    hi = ranked.gather(-1, (n // 2).clamp(max=own.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    out = []
    rows = zip(mismatch.sum(-1).tolist(), total.tolist(), lo.tolist(), hi.tolist(), n.tolist(),
               exact.tolist(), strict=True)
    for m, t, a, b, c, z in rows:
        if c == 0:
            out.append(ChunkResult(m, math.inf, math.inf, 0, 0))
        else:
            out.append(ChunkResult(m, t / c, (a + b) / 2, c, z))
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
    _check_inputs(chunk_size, topk)
    try:
        bits = to_bf16_bits(activations)
    except ProofError as e:
        return [_failed(f"bad activations: {e}") for _ in range(max(1, len(proofs)))]
    n_chunks = -(-bits.shape[0] // chunk_size)
    results: list[ChunkResult | None] = [None] * max(n_chunks, len(proofs))
    for i in range(n_chunks, len(proofs)):
        results[i] = _failed(f"proof {i} has no chunk: {len(proofs)} proofs for {n_chunks} chunks")
    for i in range(len(proofs), n_chunks):
        results[i] = _failed(f"chunk {i} has no proof: {len(proofs)} proofs for {n_chunks} chunks")
    start = 0
    for flat in _chunk_bits(bits, chunk_size):
        ids = list(range(start, min(start + flat.shape[0], len(proofs))))
        start += flat.shape[0]
        if not ids:
            continue
        if flat.shape[-1] < topk:
            for i in ids:
                results[i] = _failed(f"chunk {i} has {flat.shape[-1]} values, fewer than topk")
            continue
        idx, own = _select(flat[: len(ids)], topk)
        bad_values = _nonfinite(own).any(-1).tolist()
        good, moduli, coeffs = [], [], []
        for row, i in enumerate(ids):
            decoded = _decode(proofs[i], topk)
            if isinstance(decoded, str):
                results[i] = _failed(f"chunk {i}: {decoded}")
            elif bad_values[row]:
                results[i] = _failed(f"chunk {i}: recomputed activations contain NaN or inf")
            else:
                good.append(row)
                moduli.append(decoded[0])
                coeffs.append(decoded[1])
        if not good:
            continue
        rows = torch.tensor(good, dtype=torch.int64)
        xs = idx[rows] % torch.tensor(moduli, dtype=torch.int64).unsqueeze(-1)
        claimed = gf.evaluate(torch.from_numpy(np.stack(coeffs)), xs)
        for row, res in zip(good, _compare(own[rows], claimed), strict=True):
            results[ids[row]] = res
    return results  # type: ignore[return-value]
