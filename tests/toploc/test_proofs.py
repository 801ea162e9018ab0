"""Proof building and verification: wire format, dtypes, ties, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.toploc import (
    ProofError,
    Thresholds,
    build_proofs,
    chunk_lengths,
    find_moduli,
    proof_from_base64,
    proof_to_base64,
    verdict,
    verify_proofs,
)
from meshrl.toploc import proofs as proofs_mod
from meshrl.toploc.gf import P


def _acts(tokens=70, hidden=64, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, hidden, generator=g).to(dtype)


def _horner(proof: bytes, x: int) -> int:
    """The reference library's reading of a proof: >u2 modulus, >u2 ascending coefficients."""
    words = [int.from_bytes(proof[i : i + 2], "big") for i in range(0, len(proof), 2)]
    modulus, coeffs = words[0], words[1:]
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * (x % modulus) + c) % P
    return acc


def test_hand_checked_proof():
    acts = torch.tensor([[0.5, -3.0, 1.0, 2.0]], dtype=torch.bfloat16)
    (proof,) = build_proofs(acts, chunk_size=1, topk=2)
    # top-2 by |x|: index 1 (-3.0 = 0xC040) and index 3 (2.0 = 0x4000); line through both:
    # slope (0x4000 - 0xC040) / 2 = -16416 = 49081, intercept 0xC040 - 49081 = 135
    assert proof == bytes.fromhex("ffd9") + (135).to_bytes(2, "big") + (49081).to_bytes(2, "big")
    assert verify_proofs(acts, [proof], chunk_size=1, topk=2)[0].exp_mismatches == 0


def test_wire_format_and_reference_reading():
    acts = _acts(tokens=100, hidden=64)
    proofs = build_proofs(acts)  # the reference chunking: 32, 32, 32, 4
    assert len(proofs) == 4 and all(len(p) == 258 for p in proofs)
    assert build_proofs(acts[:64]) == proofs[:2]  # a chunk's proof depends on its rows only
    flat = acts[32:64].reshape(-1)
    idx = flat.float().abs().topk(120).indices  # clear of ties at the 128th value
    bits = flat.view(torch.int16).to(torch.int64) & 0xFFFF
    assert all(_horner(proofs[1], int(i)) == int(bits[i]) for i in idx)
    text = [proof_to_base64(p) for p in proofs]
    assert [proof_from_base64(t) for t in text] == proofs
    assert verify_proofs(acts, text) == verify_proofs(acts, proofs)
    res = verify_proofs(acts, proofs)
    assert all(r.exp_mismatches == 0 and r.mant_err_mean == 0 and r.reason is None for r in res)
    assert all(r.n_matched == 128 == r.n_exact and r.sign_mismatches == 0 for r in res)


def test_chunk_lengths_keep_a_short_tail():
    assert chunk_lengths(1000, 32) == [32] * 31 + [8]
    assert chunk_lengths(64, 32) == [32, 32]
    assert chunk_lengths(20, 32) == [20]
    assert chunk_lengths(0, 32) == []
    acts = _acts(tokens=1000, hidden=64)
    proofs = build_proofs(acts)
    assert len(proofs) == 32 and sum(map(len, proofs)) / 1000 == 8.256
    last = verify_proofs(acts, proofs)[-1]  # 8 tokens x 64 values
    assert last.exp_mismatches == 0 and last.n_exact == 128


def test_dtypes_are_consistent():
    base = (_acts(hidden=48) * 4).to(torch.bfloat16)
    proofs = build_proofs(base)
    for dtype in (torch.float32, torch.float16, torch.float64):
        assert build_proofs(base.to(dtype)) == proofs
        assert build_proofs(base.to(dtype).numpy() if dtype != torch.bfloat16 else base) == proofs
    # fp32 values that round to the same bf16 values verify exactly
    g = torch.Generator().manual_seed(3)
    jitter = base.float() * (1 + 1e-4 * torch.randn(base.shape, generator=g))
    res = verify_proofs(jitter, proofs)
    assert sum(r.exp_mismatches for r in res) <= 2
    assert all(r.mant_err_mean < 0.1 for r in res)


@pytest.mark.parametrize("length", [5000, 28_672])  # nth_element and partial_sort in topk
def test_ties_follow_the_reference_kernel(length):
    # heavy ties at the k-th magnitude: the selected set is the one the reference's
    # `chunk.abs().topk(k)` returns, for every sign pattern and every call
    g = torch.Generator().manual_seed(length)
    flat = (torch.randint(1, 5, (3, length), generator=g) * 128).to(torch.int16)
    flat[:, ::7] |= -0x8000  # sign bits do not change |value|
    idx, vals = proofs_mod._select(flat, 50)
    for row in range(3):
        ref = flat[row].view(torch.bfloat16).abs().topk(50).indices
        assert torch.equal(idx[row], ref)
        mag = flat[row].to(torch.int64) & 0x7FFF
        assert mag[idx[row]].min() >= mag.topk(50).values.min()  # a true top-k set
    assert torch.equal(vals, flat.gather(-1, idx).to(torch.int64) & 0xFFFF)
    # identical activations give identical proofs, whatever the caller's thread count
    acts = (torch.randint(-3, 4, (64, 256), generator=g) / 4).to(torch.bfloat16)
    proofs = build_proofs(acts)
    torch.set_num_threads(2)
    assert build_proofs(acts.clone()) == proofs and torch.get_num_threads() == 2


def test_long_chunks_search_a_modulus():
    acts = _acts(tokens=32, hidden=4096, seed=5)
    proofs = build_proofs(acts)
    assert verify_proofs(acts, proofs)[0].exp_mismatches == 0
    assert int.from_bytes(proofs[0][:2], "big") <= P


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=2, max_size=40, unique=True))
def test_modulus_is_largest_injective(indices):
    m = int(find_moduli(torch.tensor([indices]))[0])
    assert len({i % m for i in indices}) == len(indices)
    assert all(len({i % c for i in indices}) < len(indices) for c in range(m + 1, P + 1))


def test_tampering_and_wrong_activations_fail():
    acts = _acts()
    proofs = build_proofs(acts)
    bad = bytearray(proofs[0])
    bad[10] ^= 0x01
    res = verify_proofs(acts, [bytes(bad), *proofs[1:]])
    assert res[0].exp_mismatches > 100 and res[1].exp_mismatches == 0
    other = verify_proofs(_acts(seed=9), proofs)
    assert all(r.exp_mismatches > 100 for r in other)
    assert not verdict(other).accepted


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda ps: [ps[0][:-2], *ps[1:]], "bytes"),
        (lambda ps: [ps[0] + b"\x00\x00", *ps[1:]], "bytes"),
        (lambda ps: [b"\x00\x00" + ps[0][2:], *ps[1:]], "modulus"),
        (lambda ps: [ps[0][:2] + b"\xff\xff" + ps[0][4:], *ps[1:]], "coefficient"),
        (lambda ps: ps[:-1], "no proof"),
        (lambda ps: [*ps, ps[0]], "no chunk"),
        (lambda ps: ["not base64!", *ps[1:]], "base64"),
        (lambda ps: [None, *ps[1:]], "bytes"),
    ],
)
def test_bad_proofs_are_rejected_with_reason(mutate, reason):
    acts = _acts()
    res = verify_proofs(acts, mutate(build_proofs(acts)))
    failed = [r for r in res if r.reason is not None]
    assert failed and reason in failed[0].reason
    assert not verdict(res).accepted
    assert reason in " ".join(verdict(res).reasons)


def test_bad_activations():
    acts = _acts()
    proofs = build_proofs(acts)
    nan = acts.clone()
    nan[40, 3] = float("nan")
    with pytest.raises(ProofError, match="NaN"):
        build_proofs(nan)
    res = verify_proofs(nan, proofs)
    assert res[1].reason and "NaN" in res[1].reason and res[0].reason is None
    assert not verdict(res).accepted
    # a chunk of fewer values than topk (1 token x 64) commits to all of them, same proof size
    small = _acts(tokens=33, hidden=64)
    proofs64 = build_proofs(small)
    assert [len(p) for p in proofs64] == [258, 258] and proofs64[1][2 + 2 * 64:] == bytes(128)
    res64 = verify_proofs(small, proofs64)
    assert [(r.exp_mismatches, r.n_matched, r.n_exact, r.n_values) for r in res64] == \
        [(0, 128, 128, 2048), (0, 64, 64, 64)]
    moved = small.clone()
    moved[32] *= 2.0  # every value of the 1-token chunk one exponent up
    assert verify_proofs(moved, proofs64)[1].exp_mismatches == 64
    two = build_proofs(_acts(tokens=32, hidden=64)) * 2  # a full chunk's proof for the short one
    assert verify_proofs(small, two)[1].exp_mismatches > 32
    for bad in (torch.zeros(0, 64), torch.zeros(10), torch.zeros(4, 64, dtype=torch.int64), "x"):
        with pytest.raises(ProofError):
            build_proofs(bad)
        assert all(r.reason for r in verify_proofs(bad, proofs))
    assert not verdict([]).accepted


def test_infinite_statistics_never_pass():
    acts = _acts()
    proofs = build_proofs(acts)
    neg = verify_proofs(-acts, proofs)  # every sign flips: exponents and mantissas agree
    assert all(r.exp_mismatches == 0 and r.sign_mismatches == 128 for r in neg)
    assert not verdict(neg, Thresholds(max_exp_mismatches=1000)).accepted
    assert "sign" in verdict(neg).reasons[0]
    scrambled = [bytes(p[:2]) + bytes(256) for p in proofs]  # c = 0: no exponent matches
    res = verify_proofs(acts, scrambled)
    assert all(r.exp_mismatches == 128 and math.isinf(r.mant_err_mean) for r in res)
    assert not verdict(res, Thresholds(max_exp_mismatches=1000)).accepted


def test_numpy_input_matches_torch():
    acts = _acts().float()
    assert build_proofs(acts.numpy()) == build_proofs(acts)
    assert isinstance(build_proofs(np.asarray(acts.numpy(), dtype=np.float64))[0], bytes)


def test_proofs_of_many_completions_together_are_the_proofs_of_each_alone():
    """build_proofs_many (the worker's path: a file's rows at once) gives every completion the
    bytes build_proofs gives it alone: short and long completions, chunk sizes below topk
    (hidden 64: a 1-token chunk has 64 values), many ties (values on a coarse grid), and more
    chunks than one interpolation block."""
    from meshrl.toploc import build_proofs_many

    g = torch.Generator().manual_seed(3)
    for hidden in (64, 128):
        acts = [torch.randn(n, hidden, generator=g).to(torch.bfloat16) for n in
                [1, 2, 5, 31, 32, 33, 64, 70, 1, 8]]
        acts.append((torch.randn(40, hidden, generator=g) * 4).round() / 4)  # ties at top-k
        together = build_proofs_many(acts)
        assert together == [build_proofs(a) for a in acts]
        assert [len(p) for p in together] == [len(chunk_lengths(a.shape[0], 32)) for a in acts]
    many = [torch.randn(8, 64, generator=g) for _ in range(600)]  # 600 chunks > one block
    assert build_proofs_many(many) == [build_proofs(a) for a in many]
    with pytest.raises(ProofError, match="no activations"):
        build_proofs_many([_acts(), torch.zeros(0, 64)])
    bad = _acts().float()
    bad[3, 5] = float("nan")
    with pytest.raises(ProofError, match="NaN or inf"):
        build_proofs_many([_acts(), bad])


def test_verifying_many_completions_together_gives_each_ones_results():
    """verify_proofs_many (the validator's path) returns, per completion, what verify_proofs
    returns for it alone: honest rows, a row recomputed with other activations, a tampered
    proof, a missing and an extra proof, a malformed one and bad activations among them."""
    from meshrl.toploc import build_proofs_many, verify_proofs_many

    g = torch.Generator().manual_seed(4)
    acts = [torch.randn(n, 64, generator=g).to(torch.bfloat16) for n in (1, 5, 32, 40, 70, 3)]
    proofs = build_proofs_many(acts)
    items = [(a.float(), p) for a, p in zip(acts, proofs, strict=True)]
    items[1] = (torch.randn(5, 64, generator=g), proofs[1])  # another model's activations
    flipped = bytearray(proofs[3][1])
    flipped[7] ^= 0x40
    items[3] = (acts[3], [proofs[3][0], bytes(flipped)])
    items[4] = (acts[4], proofs[4][:2])  # a chunk without a proof
    items[0] = (acts[0], proofs[0] + proofs[5])  # a proof without a chunk
    items.append((acts[2], ["not base64!"]))
    items.append((torch.zeros(3), proofs[5]))  # activations of the wrong shape
    many = verify_proofs_many(items)
    assert many == [verify_proofs(a, p) for a, p in items]
    assert [len(r) for r in many] == [2, 1, 1, 2, 3, 1, 1, 1]
    assert many[2][0].exp_mismatches == 0 and many[2][0].reason is None
    assert many[1][0].exp_mismatches > 0 and many[4][2].reason and many[0][1].reason
    assert verify_proofs_many([]) == []
