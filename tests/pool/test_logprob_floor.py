"""The honest log-prob floor (pool/logprob_floor.py) checked against the sampler itself."""

from __future__ import annotations

import math

import pytest
import torch

from meshrl.inference.sampling import gumbel_noise, sample_tokens
from meshrl.pool import GUMBEL_SPAN, LOGPROB_SLACK, bad_logprob_rows, logprob_floor
from meshrl.pool.logprob_floor import G_MAX, G_MIN


def test_the_noise_extremes_are_the_samplers():
    # u = (h + 0.5) / 2^32 at h = 0 and h = 2^32 - 1, computed as the sampler computes it
    u = (torch.tensor([0, 2**32 - 1], dtype=torch.float64) + 0.5) / 4294967296.0
    g = -torch.log(-torch.log(u))
    assert g.tolist() == pytest.approx([G_MIN, G_MAX], abs=1e-12)
    assert pytest.approx(-math.log(33 * math.log(2)), abs=1e-12) == G_MIN  # -3.1300
    assert pytest.approx(33 * math.log(2), abs=1e-6) == G_MAX  # 22.8739 (u near 1)
    noise = gumbel_noise(5, list(range(64)), [0] * 64, 4096)
    assert float(noise.min()) >= G_MIN and float(noise.max()) <= G_MAX


def test_floor_values():
    assert pytest.approx(26.00385, abs=1e-4) == GUMBEL_SPAN
    assert logprob_floor(49152, 0.7) == pytest.approx(-26.00385 - 10.80270 - 1e-3, abs=1e-4)
    assert logprob_floor(49152, 0.0) == pytest.approx(-10.80270 - 1e-3, abs=1e-4)  # greedy
    assert logprob_floor(1, 1.0) == pytest.approx(-GUMBEL_SPAN - LOGPROB_SLACK)
    with pytest.raises(ValueError):
        logprob_floor(0, 1.0)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 1.0), (2.0, 0.9),
                                                    (0.0, 1.0)])
def test_the_samplers_picks_never_fall_below_the_floor(temperature, top_p):
    torch.manual_seed(0)
    v, n = 512, 256
    logits = torch.randn(n, v, dtype=torch.float64) * 40  # wide logits: low-probability picks
    picks = sample_tokens(logits, 11, list(range(n)), [3] * n, temperature, top_p)
    lp = torch.log_softmax(logits / (temperature or 1.0), -1).gather(-1, picks[:, None])
    assert float(lp.min()) >= logprob_floor(v, temperature)
    # adversarial: the row's highest-noise token i just beats the highest logit k, which has
    # the row's lowest noise; every other token is far below. The pick's log-prob is then
    # -(g_i - g_k), the most this row's noise allows, still above the floor.
    if temperature == 0:
        return
    g = gumbel_noise(11, list(range(n)), [3] * n, v)
    i, k = g.argmax(-1), g.argmin(-1)
    gap = (g.gather(-1, i[:, None]) - g.gather(-1, k[:, None])).squeeze(-1)
    adv = torch.full((n, v), -1e4, dtype=torch.float64)
    adv.scatter_(-1, k[:, None], 0.0)
    adv.scatter_(-1, i[:, None], (-gap + 1e-9)[:, None] * temperature)
    picked = sample_tokens(adv, 11, list(range(n)), [3] * n, temperature, 1.0)
    assert torch.equal(picked, i)
    lp = torch.log_softmax(adv / temperature, -1).gather(-1, i[:, None]).squeeze(-1)
    assert torch.allclose(lp, -gap - torch.log1p(torch.exp(-gap)), atol=1e-6)
    assert float(lp.min()) >= logprob_floor(v, temperature)


def test_the_floor_is_reached_at_the_noise_extremes():
    """With the picked token at u = 1 - 2^-33 and every other at u = 2^-33 (the extremes the
    hash can give), logits that tie the pick with all V - 1 others reach the floor."""
    v = 1000
    logits = torch.zeros(v, dtype=torch.float64)
    logits[0] = -GUMBEL_SPAN
    noise = torch.full((v,), G_MIN, dtype=torch.float64)
    noise[0] = G_MAX
    scores = logits + noise
    assert float(scores[0]) >= float(scores.max()) - 1e-12  # token 0 is (tied) the pick
    lp = float(torch.log_softmax(logits, -1)[0])
    assert lp == pytest.approx(-GUMBEL_SPAN - math.log(v - 1 + math.exp(-GUMBEL_SPAN)))
    assert logprob_floor(v, 1.0) <= lp < logprob_floor(v, 1.0) + 3e-3


def test_bad_rows():
    f = logprob_floor(100, 1.0)  # -30.609...
    rows = [([-1.0, -30.0], 2), ([-100.0], 1), ([0.0005], 1), ([0.01], 1), ([math.nan], 1),
            ([-math.inf], 1), ([-1.0], 2), ([], 0)]
    assert bad_logprob_rows(rows, f) == [1, 3, 4, 5, 6]
