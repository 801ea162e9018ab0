"""Batched polynomial arithmetic over GF(65497), the field TOPLOC commits in.

Why not Newton divided differences as in the reference implementation: that needs k sequential
steps per chunk. Here interpolation is Lagrange in monomial form, computed for all chunks at once
with O(log k) tensor operations and three batched matrix products:

    M(x)   = prod_j (x - x_j)                      product tree of linear factors
    w_i    = 1 / M'(x_i)                           inverse table lookup
    S_e    = sum_i y_i w_i x_i^e                   one bmm with the power table x_i^e
    c_j    = sum_{e=0}^{k-1-j} M_{j+1+e} S_e       one bmm with a Toeplitz matrix of M

since M(x)/(x - x_i) = sum_j x^j sum_{t>j} M_t x_i^{t-j-1}. Every matrix product runs in float64:
its terms are < P^2 < 2^32 and it sums at most 2^20 of them, so all partial sums stay below 2^53
and the products are exact integers. Evaluation is likewise one bmm with a power table.
"""

from __future__ import annotations

import torch

__all__ = ["P", "evaluate", "interpolate", "inverse_table", "poly_from_roots", "power_table"]

P = 65497  # the largest prime below 2^16 - 38; every finite bf16 bit pattern is < P

_INV: torch.Tensor | None = None


def inverse_table() -> torch.Tensor:
    """int64 tensor t with t[a] * a = 1 (mod P) for 1 <= a < P, and t[0] = 0."""
    global _INV
    if _INV is None:
        a = torch.arange(P, dtype=torch.int64)
        result = torch.ones_like(a)
        base, e = a.clone(), P - 2  # Fermat: a^(P-2) = a^-1
        while e:
            if e & 1:
                result = result * base % P
            base = base * base % P
            e >>= 1
        result[0] = 0
        _INV = result
    return _INV


def power_table(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[..., i]^e mod P for e < n, shape [..., len, n] (int64), by doubling: O(log n) steps."""
    x = x.to(torch.int64) % P
    out = torch.empty((*x.shape, n), dtype=torch.int64, device=x.device)
    out[..., 0] = 1
    have, sq = 1, x.unsqueeze(-1)  # sq = x^have
    while have < n:
        take = min(have, n - have)
        out[..., have : have + take] = out[..., :take] * sq % P
        have += take
        sq = sq * sq % P
    return out


def _split(n: int) -> tuple[int, int]:
    """Baby-step / giant-step sizes (b, g) with b * g >= n and b ~ sqrt(n)."""
    b = max(1, int(n**0.5 + 0.999))
    return b, -(-n // b)


def _steps(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Baby powers x^a (a < b) and giant powers x^(b*g') (g' < g) for exponents below n."""
    b, g = _split(n)
    baby = power_table(x, b + 1)
    return baby[..., :b], power_table(baby[..., b], g)


def _poly_mul_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Products of polynomials a[..., :] * b[..., :] (ascending coefficients, equal length d+1)."""
    d1 = a.shape[-1]
    outer = (a.unsqueeze(-1) * b.unsqueeze(-2)).double()  # [..., d1, d1], terms < 2^32
    # skew rows so that column a+b of row a holds outer[a, b]; then sum the rows
    padded = torch.nn.functional.pad(outer, (0, d1))  # [..., d1, 2*d1]
    flat = padded.flatten(-2)[..., : d1 * (2 * d1 - 1)]
    skewed = flat.reshape(*outer.shape[:-2], d1, 2 * d1 - 1)
    return (skewed.sum(-2) % P).to(torch.int64)[..., : 2 * d1 - 1]


def poly_from_roots(roots: torch.Tensor) -> torch.Tensor:
    """Coefficients (ascending, length n+1) of prod_j (x - roots[..., j]) mod P."""
    roots = roots.to(torch.int64) % P
    n = roots.shape[-1]
    size = 1 << max(0, (n - 1).bit_length())
    polys = torch.zeros((*roots.shape[:-1], size, 2), dtype=torch.int64, device=roots.device)
    polys[..., 0] = 1  # padding factors are the constant 1
    polys[..., :n, 0] = (P - roots) % P
    polys[..., :n, 1] = 1
    while polys.shape[-2] > 1:
        polys = _poly_mul_pairs(polys[..., 0::2, :], polys[..., 1::2, :])
    return polys[..., 0, : n + 1]


def _bmm_mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(a @ b) mod P for int64 tensors with entries in [0, P), exact through float64."""
    return (torch.matmul(a.double(), b.double()) % P).to(torch.int64)


def interpolate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Coefficients c[..., :k] (ascending) of the unique polynomial of degree < k with c(x) = y.

    x: [..., k] distinct modulo P (checked by the caller), y: [..., k]; both reduced mod P here.
    """
    x = x.to(torch.int64) % P
    y = y.to(torch.int64) % P
    k = x.shape[-1]
    m = poly_from_roots(x)  # [..., k+1]
    dm = m[..., 1:] * torch.arange(1, k + 1, dtype=torch.int64, device=x.device) % P  # M'
    baby, giant = _steps(x, k)
    dval = _evaluate_steps(dm, baby, giant)  # M'(x_i), nonzero for distinct x
    a = y * inverse_table().to(x.device)[dval] % P
    # S_{u + b v} = sum_i (a_i x_i^u) (x_i^b)^v: one bmm over the points
    s = _bmm_mod((a.unsqueeze(-1) * baby % P).transpose(-1, -2), giant)  # [..., b, g]
    s = s.transpose(-1, -2).flatten(-2)[..., :k]  # S_e, e = u + b v
    mpad = torch.cat([m[..., 1:], torch.zeros_like(m[..., 1:])], dim=-1)  # [..., 2k]
    toeplitz = mpad.unfold(-1, k, 1)[..., :k, :]  # [j, e] = M_{j+1+e} (0 beyond degree k)
    return _bmm_mod(toeplitz, s.unsqueeze(-1)).squeeze(-1)


def _evaluate_steps(coeffs: torch.Tensor, baby: torch.Tensor, giant: torch.Tensor) -> torch.Tensor:
    b, g = baby.shape[-1], giant.shape[-1]
    c = torch.nn.functional.pad(coeffs.to(torch.int64) % P, (0, b * g - coeffs.shape[-1]))
    inner = _bmm_mod(baby, c.reshape(*c.shape[:-1], g, b).transpose(-1, -2))  # [..., n, g]
    return ((inner * giant).double().sum(-1) % P).to(torch.int64)


def evaluate(coeffs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """c(x) mod P for coefficients [..., k] (ascending) at points [..., n]; returns [..., n]."""
    baby, giant = _steps(x, coeffs.shape[-1])
    return _evaluate_steps(coeffs, baby, giant)
