"""The validator's checks on real worker batches: honest files pass with their numbers, and each
in-process cheat is caught by the check that names it, as a hard finding."""

from __future__ import annotations

import pytest
from helpers import PROVIDER, assignment, claim, roundtrip, rules

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.validator.replay import ReplayConfig
from meshrl.validator.verify import verify_file, verify_files
from meshrl.worker.cheats import Cheat
from meshrl.worker.config import CheatConfig
from meshrl.worker.rollouts import generate_rollouts


def _honest(engine, tok, r, **kw):
    return roundtrip(generate_rollouts(engine, tok, assignment(r, **kw), PROVIDER))[0]


def test_honest_file_is_accepted_with_numbers(engine, tok):
    r = rules(max_new=16)
    b = _honest(engine, tok, r)
    rep = verify_file(engine, tok, b, claim(b), r)
    assert rep.accepted, rep.reason()
    assert rep.stats.rows == 8
    assert rep.stats.tokens == sum(len(x.completion_tokens) for x in b.completions)
    assert rep.stats.max_sampling_margin <= ReplayConfig().sampling_tolerance
    assert rep.stats.max_logprob_diff < 1e-3
    assert rep.stats.chunks == 8  # one proof per completion of <= 32 tokens


def test_validator_batch_size_and_threads_do_not_matter(model, tok, engine):
    r = rules(max_new=24, prompts=3)
    items = [(b, claim(b), r) for b in (_honest(engine, tok, r, counter=c)
                                              for c in range(3))]
    other = CPUEngine(model, tok, EngineConfig(max_batch_size=5, num_threads=2))
    for rep in verify_files(other, tok, items, ReplayConfig(max_batch_rows=7)):
        assert rep.accepted, rep.reason()


def _cheat(engine, model, tok, r, mode, **cfg):
    cheat = Cheat(CheatConfig(mode=mode, **cfg))
    a = assignment(r)
    eng = engine
    state = cheat.weights(model.state_dict(), model.config, a.step)
    if state is not model.state_dict() and mode in ("other-model", "int8", "scale-layer"):
        eng = CPUEngine(model, tok, EngineConfig(num_threads=1))
        eng.load_weights(state, version=0)
    b = generate_rollouts(eng, tok, a, PROVIDER, problems=cheat.problems(a),
                          sampling=cheat.sampling(a), edit=cheat.edit(a.step, tok.eos_token_id))
    return roundtrip(cheat.finish(b))[0]


@pytest.mark.parametrize(("mode", "check"), [
    ("other-model", "toploc"),
    ("int8", "toploc"),
    ("scale-layer", "toploc"),
    ("cherry-pick", "prompts"),
    ("forge-rewards", "rewards"),
    ("forge-sampling", "sampling"),
    ("truncate", "sampling"),
    ("inflate-units", "work_units"),
])
def test_each_generation_cheat_is_a_hard_finding(engine, model, tok, mode, check):
    r = rules(max_new=32, prompts=2, group=4)
    b = _cheat(engine, model, tok, r, mode)
    rep = verify_file(engine, tok, b, claim(b), r)
    assert not rep.accepted and rep.hard
    assert check in [f.check for f in rep.findings], rep.reason()
