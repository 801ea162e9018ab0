"""Sampled replay, the published rule: how many rows, which rows (from the submission's block
hash and the file's sha256, recomputable by anyone), the catch probability, and the rule's
place in the rules digest, by hand-checked values."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from meshrl.pool import (
    FULL_REPLAY,
    PoolRules,
    ReplayRule,
    catch_probability,
    replayed_count,
    replayed_rows,
)

SHA = "ab" * 32
BLOCK = bytes(range(32))


def test_the_count_is_the_fraction_rounded_up_within_min_rows_and_the_file():
    r = ReplayRule()
    assert r.rows_fraction == 0.25 and r.min_rows == 1  # the default that meets the cost goal
    assert [replayed_count(r, n) for n in (1, 3, 4, 5, 8, 128)] == [1, 1, 1, 2, 2, 32]
    tenth = ReplayRule(rows_fraction=0.1)
    assert replayed_count(tenth, 10) == 1  # 0.1 * 10 is 1.0000000000000002 in floats
    assert replayed_count(ReplayRule(rows_fraction=0.1, min_rows=4), 10) == 4
    assert replayed_count(ReplayRule(min_rows=4), 2) == 2
    assert [replayed_count(FULL_REPLAY, n) for n in (1, 7, 128)] == [1, 7, 128]
    for bad in ({"rows_fraction": 0.0}, {"rows_fraction": 1.5}, {"min_rows": 0},
                {"rows_fraction": float("nan")}, {"every": 2}):
        with pytest.raises(ValidationError):
            ReplayRule.model_validate(bad)


def _by_hand(n: int, m: int, sha: str, block: bytes) -> list[int]:
    """The rule as docs/economics.md writes it, recomputed with nothing but hashlib."""
    key = hashlib.sha256(b"meshrl-replay-rows-v1\n" + block + b"\n" + sha.encode()).digest()
    rank = {i: hashlib.sha256(key + i.to_bytes(4, "big")).digest() for i in range(n)}
    return sorted(sorted(range(n), key=rank.__getitem__)[:m])


def test_the_rows_are_recomputable_from_the_block_and_the_file():
    rows = replayed_rows(ReplayRule(), 8, SHA, BLOCK)
    assert rows == _by_hand(8, 2, SHA, BLOCK) == [6, 7]
    assert replayed_rows(ReplayRule(), 8, SHA.upper(), BLOCK) == rows  # hex in either case
    assert replayed_rows(ReplayRule(rows_fraction=0.5), 128, SHA, BLOCK) == \
        _by_hand(128, 64, SHA, BLOCK)
    assert replayed_rows(FULL_REPLAY, 5, SHA, BLOCK) == [0, 1, 2, 3, 4]
    # another block, or another file, picks other rows
    others = {tuple(replayed_rows(ReplayRule(), 8, SHA, bytes([b]) * 32)) for b in range(20)}
    files = {tuple(replayed_rows(ReplayRule(), 8, f"{b:064x}", BLOCK)) for b in range(20)}
    assert len(others) > 10 and len(files) > 10


@given(st.integers(1, 300), st.floats(0.01, 1.0), st.binary(min_size=32, max_size=32))
def test_the_rows_are_distinct_sorted_and_as_many_as_the_count(n, fraction, block):
    rule = ReplayRule(rows_fraction=fraction)
    rows = replayed_rows(rule, n, SHA, block)
    assert rows == sorted(set(rows)) and len(rows) == replayed_count(rule, n)
    assert all(0 <= i < n for i in rows)


def test_every_row_is_picked_equally_often():
    """Over 4000 blocks, each of 8 rows is replayed in 1/4 of the files (2 of 8), within
    4 standard deviations of the binomial count."""
    counts = [0] * 8
    for b in range(4000):
        for i in replayed_rows(ReplayRule(), 8, SHA, hashlib.sha256(b"%d" % b).digest()):
            counts[i] += 1
    sd = math.sqrt(4000 * 0.25 * 0.75)
    assert all(abs(c - 1000) < 4 * sd for c in counts), counts


def test_the_catch_probability_by_hand():
    assert catch_probability(8, 1, 1) == pytest.approx(1 / 8)
    assert catch_probability(8, 2, 1) == pytest.approx(2 / 8)
    assert catch_probability(8, 2, 2) == pytest.approx(1 - 15 / 28)  # C(6,2) / C(8,2)
    assert catch_probability(8, 2, 8) == 1.0 and catch_probability(8, 2, 7) == 1.0
    assert catch_probability(8, 2, 0) == 0.0
    assert catch_probability(128, 32, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        catch_probability(8, 9, 1)


def test_the_rule_is_in_the_digest_and_full_replay_keeps_the_old_one():
    sampled, full = PoolRules(pool_id=1), PoolRules(pool_id=1, replay=FULL_REPLAY)
    assert sampled.digest() != full.digest()
    assert PoolRules(pool_id=1, replay={"rows_fraction": 0.5}).digest() != sampled.digest()
    # full replay: the digest of the same rules from before the field existed (and before
    # policy_signer, prompt_format and batch, whose unset/raw/per-file values also keep the
    # old digest)
    old = full.model_dump(mode="json")
    del old["replay"], old["policy_signer"], old["prompt_format"], old["batch"]
    canonical = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    assert full.digest() == hashlib.sha256(canonical).hexdigest()
