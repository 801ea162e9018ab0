"""The honest range of a claimed log-prob, a published rule derived from the sampler.

The sampler (`meshrl.inference.sampling`, docs/sampling.md) picks token i only if
l_i / T + g_i >= l_j / T + g_j for every kept j, with Gumbel noise g = -log(-log(u)) and
u = (h + 0.5) / 2^32 for a 32-bit hash h, so u lies in [2^-33, 1 - 2^-33] and g in
[G_MIN, G_MAX]. The argmax of the logits is always kept (top-p keeps it first), hence
l_i / T >= l_max / T - (G_MAX - G_MIN), and since logsumexp(l / T) <= l_max / T + log V:

    log_softmax(l / T)[i] >= -(G_MAX - G_MIN) - log V        (about -36.9 for V = 49,152)

Greedy (T = 0) picks the argmax; its log-prob (of T = 1, per the contract) is >= -log V. A
log-prob is never above 0. A claimed value outside [floor - slack, slack] is one no honest
sampler produces: the validator's model-free checks refuse it on every row (replayed or not)
and the trainer refuses the file, so nothing it learns from can push an importance ratio past
what the sampler allows. `LOGPROB_SLACK` absorbs float32 rounding of honest log-softmaxes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = [
    "GUMBEL_SPAN",
    "G_MAX",
    "G_MIN",
    "LOGPROB_SLACK",
    "bad_logprob_rows",
    "logprob_floor",
]

_U_MIN = 2.0 ** -33  # (0 + 0.5) / 2^32
_U_MAX = 1.0 - 2.0 ** -33  # (2^32 - 1 + 0.5) / 2^32, exact in float64
G_MIN = -math.log(-math.log(_U_MIN))  # about -3.130
G_MAX = -math.log(-math.log(_U_MAX))  # about 22.874
GUMBEL_SPAN = G_MAX - G_MIN  # about 26.004
LOGPROB_SLACK = 1e-3  # nats: float32 rounding of an honest log_softmax, far above it


def logprob_floor(vocab_size: int, temperature: float) -> float:
    """The smallest log-prob an honest sampler of `vocab_size` logits at `temperature` can
    report for a token it picked (module docstring), less `LOGPROB_SLACK`."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    span = 0.0 if temperature == 0 else GUMBEL_SPAN
    return -span - math.log(vocab_size) - LOGPROB_SLACK


def bad_logprob_rows(rows: Iterable[tuple[Sequence[float], int]], floor: float) -> list[int]:
    """Indices of rows whose (log-probs, completion length) pair no honest sampler gives: not
    one log-prob per token, or one that is not finite, below `floor` or above `LOGPROB_SLACK`."""
    return [i for i, (lps, n) in enumerate(rows)
            if len(lps) != n or not all(floor <= x <= LOGPROB_SLACK for x in lps)]
