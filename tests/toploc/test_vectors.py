"""Wire compatibility with the reference TOPLOC (toploc 0.1.6) and pinned proof bytes.

`tests/toploc/vectors/` holds proofs the reference built from known activations and what its
verifier reported on them (see its README). meshrl must build the same bytes and report
the same statistics, for every case: token counts off the chunk grid, hidden 128 to 4096,
outlier channels and heavy ties at the k-th magnitude.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from meshrl.toploc import build_proofs, verify_proofs

VECTORS = Path(__file__).resolve().parent / "vectors"


def _cases() -> list[dict]:
    return json.loads((VECTORS / "vectors.json").read_text())["cases"]


def _load(name: str) -> torch.Tensor:
    raw = np.load(VECTORS / name)
    assert raw.dtype == np.uint16 and raw.ndim == 2
    return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)


CASES = _cases()


def _stats(results) -> list[list[float]]:
    assert all(r.reason is None for r in results), [r.reason for r in results]
    return [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in results]


def test_vectors_cover_the_hard_cases():
    assert len(CASES) >= 8
    assert any(c["tokens"] % c["chunk_size"] for c in CASES)  # a short last chunk
    assert {c["hidden"] for c in CASES} >= {128, 896, 4096}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_reference_vectors(case):
    acts = _load(case["activations"])
    assert tuple(acts.shape) == (case["tokens"], case["hidden"])
    reference = [bytes.fromhex(h) for h in case["proofs_hex"]]
    # identical activations give byte-identical proofs, ties included
    assert build_proofs(acts, case["chunk_size"], case["topk"]) == reference
    assert len(reference) == -(-case["tokens"] // case["chunk_size"])
    # and the verifier reports the reference's statistics, exactly, on both inputs
    same = verify_proofs(acts, reference, case["chunk_size"], case["topk"])
    assert _stats(same) == case["verify_same"]
    perturbed = _load(case["perturbed_activations"])
    res = verify_proofs(perturbed, reference, case["chunk_size"], case["topk"])
    assert _stats(res) == case["verify_perturbed"]


def test_coarse_values_tie_at_the_kth_magnitude():
    (case,) = [c for c in CASES if c["name"].startswith("coarse")]
    flat = _load(case["activations"])[:32].reshape(-1).float().abs()
    kth = flat.topk(case["topk"]).values[-1]
    assert int((flat == kth).sum()) > 1000  # the tie choice decides most of the set


def _pinned_activations() -> torch.Tensor:
    """40 tokens x 128 of coarse values (many ties), from integer arithmetic only."""
    i, j = torch.arange(40).unsqueeze(-1), torch.arange(128)
    return ((((i * 37 + j * 11) % 29) - 14) / 8).to(torch.bfloat16)


PINNED = [  # build_proofs(_pinned_activations()): 32 tokens, then a short chunk of 8
    "ffd9d92bae4b188f5be92cc2b31b90ba93b425a363d2ba5a452d85a31fe7c441e5c07b1637372b43b8a69871"
    "e881478f108bedb23f42f99cf1f6c7fb51e7f153bf7d04b9962ebdb6ad370f1c91319151d1ff0c049f465f46"
    "6ac51affcbe35c916921a24a7dc7cbc8218e5a7fe5738a805620ca4c7ebeb5298779c1c456af8b968fcc1c5c"
    "4777c287af7aa887d87eefe5407f8f6e62a05f6e527748c8c067acfebab8b75c591b9b2080ae849a1fcafe36"
    "9c1dad23bc5b2831e9cd985a800f30ab6dbe8b8497f0d14e6b89e5bf0f2c53f10bd897546072bc60827524c6"
    "c1ec8e03cb7b54b1cd264995f2d3301f83012219f8ca43995cd17b395a22d2ace7e5e5be1121",
    "ffd9d3fe63e809d64f58359b2c963120012a1fe062ca8004ea89ef8466cafcf696be622e189de71d6eb5ee5a"
    "4b3f5ae2a529e9293d14c0ba752ce9d16a44bacfeebaa1839f26a24e9ee8e75ba3ef4f6f3d1eace05522f3db"
    "b33cb8ad2655266fad4a080fb18ba630bc8d8d7a71d0939fa4825885a1f54246286a9c70812f2ccfe06cd49f"
    "f92ad799d2c846274d1ba17a206259b2921920eee394cae15f3ba2cbfb8b4c98c31f3292543e8bc2ce251303"
    "2a68eb308636e9747b179da41695ec6b06a7d3e94903ac71c71c4a1e42be88341e3220d1218b615dccba1f70"
    "7a721ce4c57716e4ca6815c92b7f3d3cd83c5c01b5c0ef823dbf5aa98d7c820d6312fdf98079",
]


def test_pinned_proof_bytes():
    """Fixed activations -> exact bytes: the wire format and the tie rule cannot drift."""
    assert [p.hex() for p in build_proofs(_pinned_activations())] == PINNED
    small = torch.tensor([[0.5, -3.0, 1.0, 2.0, 2.0, -0.25], [2.0, 1.5, -2.0, 2.0, 1.0, 7.0]],
                         dtype=torch.bfloat16)
    proofs = build_proofs(small, chunk_size=1, topk=3)
    assert [p.hex() for p in proofs] == ["ffd940a76a391560", "ffd94000993fccc4"]
    # row 1 ties three |2.0| for two places: the reference's kernel takes indices 3 and 0
    # (not the two lowest, 0 and 2); the proof commits to 7.0 = 0x40E0 at 5, 2.0 = 0x4000 at 3, 0
    words = [int.from_bytes(proofs[1][i : i + 2], "big") for i in range(0, 8, 2)]

    def at(x: int) -> int:
        return (words[1] + words[2] * x + words[3] * x * x) % 65497

    assert (at(5), at(3), at(0)) == (0x40E0, 0x4000, 0x4000) and at(2) != 0xC000
