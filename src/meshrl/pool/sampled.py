"""Sampled replay, a published rule: which rows of a file a validator replays on the model.

The cheap checks (schema, node, slot claim, units, rules digest, version window, seed, prompts,
rewards, row ids, termination) run on every row of every file. The model replay (sampling
noise, log-probs, TOPLOC proofs: one prefill per row, most of a validator's cost) runs on
`replayed_count(rule, n)` rows of the file's n, chosen by `replayed_rows`:

    key  = sha256("meshrl-replay-rows-v1\\n" || block hash || "\\n" || file sha256 (hex, ASCII))
    rank = sha256(key || row index as 4 bytes big-endian), for every row
    rows = the `replayed_count` rows of smallest rank, in row order

The block hash is the hash of the block that holds the file's `WorkSubmitted` event, or, for a
file submitted in a batch (issue 46), its batch's `BatchSubmitted` event (each file of the
batch still keys its own rows by its own sha256, so batch-mates get independent draws). A worker
commits to every byte of the file (its sha256, on chain) before that block exists: it cannot know
which rows will be replayed until its submission is final, and cannot change the file after.
Anyone can recompute the rows afterwards from public data (the block, the file). What a block
producer can do is in docs/economics.md ("Why a worker cannot predict or steer the rows").

`catch_probability` is the chance that a file with k forged rows of n has at least one of them
replayed (hypergeometric); docs/economics.md prices cheating by it.
"""

from __future__ import annotations

import hashlib
import math

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FULL_REPLAY", "ReplayRule", "catch_probability", "replayed_count", "replayed_rows"]

_DOMAIN = b"meshrl-replay-rows-v1\n"


class ReplayRule(BaseModel):
    """How many rows of each file a validator replays on the model (the rest get every check
    that needs no model). `rows_fraction = 1`: every row, the full replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows_fraction: float = Field(0.25, gt=0.0, le=1.0, allow_inf_nan=False,
                                 description="fraction of a file's rows replayed on the model "
                                 "(rounded up; 1: every row)")
    min_rows: int = Field(1, ge=1, le=1 << 20, description="rows replayed at least (all of a "
                          "file's rows if it has fewer)")


FULL_REPLAY = ReplayRule(rows_fraction=1.0)


def replayed_count(rule: ReplayRule, n: int) -> int:
    """How many of a file's `n` rows are replayed: ceil(fraction * n), at least `min_rows`,
    at most n."""
    m = math.ceil(rule.rows_fraction * n - 1e-9)  # 0.1 * 10 is 1.0000000000000002
    return max(0, min(n, max(rule.min_rows, m)))


def replayed_rows(rule: ReplayRule, n: int, file_sha256: str, block_hash: bytes) -> list[int]:
    """The indices (ascending) of the rows of a file of `n` rows that are replayed, derived
    from the hash of the submission's block and the file's sha256 (module docstring)."""
    m = replayed_count(rule, n)
    if m >= n:
        return list(range(n))
    key = hashlib.sha256(_DOMAIN + bytes(block_hash) + b"\n"
                         + file_sha256.lower().encode()).digest()
    ranked = sorted(range(n), key=lambda i: hashlib.sha256(key + i.to_bytes(4, "big")).digest())
    return sorted(ranked[:m])


def catch_probability(n: int, m: int, k: int) -> float:
    """Probability that at least one of `k` forged rows of `n` is among `m` rows drawn without
    replacement: 1 - C(n - k, m) / C(n, m)."""
    if not 0 <= k <= n or not 0 <= m <= n:
        raise ValueError(f"need 0 <= k, m <= n, got n={n} m={m} k={k}")
    return 1.0 - math.comb(n - k, m) / math.comb(n, m)
