"""Issue #41: a file is sampled by the pool's rules or it is not the pool's work.

A rollout header carries no sampling parameters: it names the rules it was generated under by
their digest (`rules_sha256`, checked equal to the published rules'), and the validator's
replay takes temperature, top_p, max_new_tokens and stop tokens from the published rules,
never from the file. So a file whose header names the right digest but was sampled at another
top_p is judged by the pool's top_p and its tokens are not the sampler's picks. A worker cannot
grind a counter either: its prompts and its sampling seed are derived from (node, step,
counter), so the file of a counter is one file; another seed or another counter's rows are
hard findings.
"""

from __future__ import annotations

import pytest
from helpers import PROVIDER, assignment, claim, honest_file, roundtrip, rules

from meshrl.pool import Check, PoolRules, VerdictKind
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import _spec, verify_file
from meshrl.wire.rollout_file import RolloutHeader, rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts

pytestmark = pytest.mark.anvil  # some tests start anvil (tests/anvil_rule.py)


def _top_p(r: PoolRules, top_p: float) -> PoolRules:
    return r.model_copy(update={"sampling": r.sampling.model_copy(update={"top_p": top_p})})


@pytest.mark.parametrize(("profile", "pool", "sampled"), [
    ("any-hardware", 0.9, 0.95), ("meshrl-cpu-engine", 0.9, 0.95),
    ("meshrl-cpu-engine", 0.9, 0.92)])
def test_a_file_sampled_at_another_top_p_under_the_right_digest_is_hard(engine, tok, profile,
                                                                         pool, sampled):
    base = rules(max_new=16, prompts=2, group=4).model_copy(update={"proof_profile": profile})
    published, used = _top_p(base, pool), _top_p(base, sampled)
    assert "top_p" not in RolloutHeader.model_fields  # the digest is the file's only claim
    replay = ReplayConfig(thresholds=profile_thresholds(profile))
    for counter in (0, 1):
        rf = generate_rollouts(engine, tok, assignment(used, counter=counter),
                               used.task.build(), PROVIDER)
        rf.header = rf.header.model_copy(update={"rules_sha256": published.digest()})
        rf = roundtrip(rf)[0]
        spec = _spec(rf, published, tok, None)
        assert (spec.top_p, spec.temperature) == (pool, published.sampling.temperature)
        d = verify_file(engine, tok, rf, claim(rf), published, published.task.build(), replay)
        assert d.kind is VerdictKind.HARD_INVALID and d.checks[0] is Check.SAMPLING, d.reason
        # the same rows under the digest of the rules they were sampled by: another pool's
        d = verify_file(engine, tok, roundtrip(rf)[0], claim(rf), used, used.task.build(),
                        replay)
        assert Check.RULES in d.checks, d.reason


def test_a_counter_cannot_be_ground(engine, tok):
    """Within the granted range every counter is work of its own, and one file: generating it
    again gives the same bytes; another sampling seed, or another counter's rows under this
    counter, are hard."""
    r = rules(max_new=8, prompts=2, group=4)
    tasks = r.task.build()
    one = honest_file(engine, tok, r, counter=1)
    again = honest_file(engine, tok, r, counter=1)
    assert rollout_file_bytes(one) == rollout_file_bytes(again)
    assert verify_file(engine, tok, one, claim(one), r, tasks).accepted
    reseeded = generate_rollouts(engine, tok, assignment(r, counter=1), tasks, PROVIDER)
    reseeded.header = reseeded.header.model_copy(
        update={"sampling_seed": reseeded.header.sampling_seed ^ 1})
    d = verify_file(engine, tok, roundtrip(reseeded)[0], claim(reseeded), r, tasks)
    assert d.kind is VerdictKind.HARD_INVALID and Check.SAMPLING_SEED in d.checks, d.reason
    other = honest_file(engine, tok, r, counter=2)
    for c in other.completions:
        c.counter = 1
    other.header = other.header.model_copy(update={"sampling_seed": one.header.sampling_seed})
    d = verify_file(engine, tok, roundtrip(other)[0], claim(other), r, tasks)
    assert d.kind is VerdictKind.HARD_INVALID and Check.PROMPTS in d.checks, d.reason
