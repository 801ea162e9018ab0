"""A validator re-runs a code task's programs in the sandbox: an honest file is accepted, a
reward claimed for a program that fails (or never halts) is a hard finding, and a program that
passes is rewarded 1.0 by the validator's own run."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import claim, honest_file, rules

from meshrl.pool import Check, PoolRules, VerdictKind
from meshrl.tasks.dataset import data_digest
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import model_free_findings, verify_file

if shutil.which("bwrap") is None:
    pytest.skip("bubblewrap is not installed", allow_module_level=True)

ENGINE = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
SUM = "print(sum(map(int, open(0).read().split()[1:])))"  # one line: the char tokenizer has no \n


@pytest.fixture
def code_rules(tmp_path) -> PoolRules:
    data = tmp_path / "sum.jsonl"
    data.write_text(json.dumps({"prompt": "Print the sum of the n integers after n.", "tests": [
        {"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "2\n-5 9\n", "output": "4\n"}]})
        + "\n")
    base = rules(max_new=8, prompts=2, group=2)
    task = {"type": "code", "path": str(data), "sha256": data_digest(data),
            "heldout_fraction": 0.0, "sandbox": {"cpu_s": 1, "wall_s": 3.0}}
    return PoolRules.model_validate({**base.model_dump(), "task": {"mix": [task]}})


def _reward_findings(rf, r, tok):
    return [f for f in model_free_findings(rf, claim(rf), r, r.task.build(), tok)
            if f.check is Check.REWARDS]


def test_validator_reruns_programs(engine, tok, code_rules) -> None:
    r = code_rules
    b = honest_file(engine, tok, r)
    assert [row.reward for row in b.completions] == [0.0] * 4  # an untrained policy's junk
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.accepted, d.reason
    b.completions[1].reward = 1.0  # a worker claiming its junk passed the tests
    d = verify_file(engine, tok, b, claim(b), r, r.task.build(), ENGINE)
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.REWARDS,), d.reason
    b.completions[1].reward = 0.0
    b.completions[0].completion_tokens = tok.encode(SUM)
    b.completions[0].reward = 1.0  # the validator's own sandboxed run agrees
    assert _reward_findings(b, r, tok) == []
    b.completions[0].completion_tokens = tok.encode("while True: pass")
    (f,) = _reward_findings(b, r, tok)
    assert "claims 1.0, recomputed 0.0" in f.reason
