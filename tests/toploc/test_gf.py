"""GF(65497) interpolation and evaluation against a naive pure-Python reference."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.toploc import gf

P = gf.P


def naive_interpolate(xs: list[int], ys: list[int]) -> list[int]:
    """Newton divided differences then expansion to monomial form, one number at a time."""
    n = len(xs)
    dd = [y % P for y in ys]
    for k in range(1, n):
        for i in range(n - 1, k - 1, -1):
            dd[i] = (dd[i] - dd[i - 1]) * pow(xs[i] - xs[i - k], P - 2, P) % P
    coeffs, basis = [0] * n, [1] + [0] * n  # basis = prod_{j<i} (x - x_j)
    for i in range(n):
        for j in range(i + 1):
            coeffs[j] = (coeffs[j] + dd[i] * basis[j]) % P
        nxt = [0] * (n + 1)
        for j in range(i + 1):
            nxt[j + 1] += basis[j]
            nxt[j] -= xs[i] * basis[j]
        basis = [v % P for v in nxt]
    return coeffs


def naive_eval(coeffs: list[int], x: int) -> int:
    return sum(c * pow(x, e, P) for e, c in enumerate(coeffs)) % P


def test_hand_checked_values():
    assert P == 65497 and all(P % d for d in range(2, 256))  # prime
    # through (0, 1), (1, 3), (2, 7): 1 + x + x^2
    coeffs = gf.interpolate(torch.tensor([[0, 1, 2]]), torch.tensor([[1, 3, 7]]))
    assert coeffs.tolist() == [[1, 1, 1]]
    # a line through (1, 0) and (2, P - 1): -x + 1 = P - x + 1
    coeffs = gf.interpolate(torch.tensor([[1, 2]]), torch.tensor([[0, P - 1]]))
    assert coeffs.tolist() == [[1, P - 1]]
    assert gf.evaluate(torch.tensor([[5, 0, 2]]), torch.tensor([[3, P - 1]])).tolist() == [[23, 7]]
    inv = gf.inverse_table()
    assert inv[1] == 1 and inv[2] == (P + 1) // 2 and inv[0] == 0
    a = torch.arange(1, P)
    assert bool((a * inv[1:] % P == 1).all())


def test_poly_from_roots_and_power_table():
    assert gf.poly_from_roots(torch.tensor([[2, 3]])).tolist() == [[6, P - 5, 1]]
    assert gf.poly_from_roots(torch.tensor([[1, 2, 3]])).tolist() == [[P - 6, 11, P - 6, 1]]
    assert gf.power_table(torch.tensor([3]), 5).tolist() == [[1, 3, 9, 27, 81]]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_matches_naive_reference(data):
    k = data.draw(st.integers(1, 40))
    xs = data.draw(st.lists(st.integers(0, P - 1), min_size=k, max_size=k, unique=True))
    ys = data.draw(st.lists(st.integers(0, 2**16 - 1), min_size=k, max_size=k))
    coeffs = gf.interpolate(torch.tensor([xs]), torch.tensor([ys]))[0].tolist()
    assert coeffs == naive_interpolate(xs, ys)
    probe = data.draw(st.lists(st.integers(0, P - 1), min_size=1, max_size=8))
    got = gf.evaluate(torch.tensor([coeffs]), torch.tensor([probe]))[0].tolist()
    assert got == [naive_eval(coeffs, x) for x in probe]


def test_batched_k128_roundtrip_and_uniqueness():
    g = torch.Generator().manual_seed(0)
    xs = torch.stack([torch.randperm(P, generator=g)[:128] for _ in range(5)])
    ys = torch.randint(0, P, (5, 128), generator=g)
    coeffs = gf.interpolate(xs, ys)
    assert coeffs.shape == (5, 128)
    assert torch.equal(gf.evaluate(coeffs, xs), ys)
    assert coeffs[2].tolist() == naive_interpolate(xs[2].tolist(), ys[2].tolist())
    # batching does not mix chunks
    assert torch.equal(gf.interpolate(xs[2:3], ys[2:3])[0], coeffs[2])
