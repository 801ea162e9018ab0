"""A task mix as a pool rule: one reasoning-gym dataset, one dataset on disk and one code task,
published by an orchestrator (`GET /rules` JSON), pinned by a worker or validator, and
regenerated identically from the published JSON."""

import json

import pytest

from meshrl.pool import Assignment, PoolRules, RulesPins, rules_drift
from meshrl.tasks import compute_reward
from meshrl.tasks.dataset import DatasetError, data_digest

SANDBOX = {"cpu_s": 1, "wall_s": 3.0}


@pytest.fixture
def rules(tmp_path) -> PoolRules:
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} * 3 = ?", "answer": str(3 * i)}) + "\n"
                            for i in range(30)))
    return PoolRules(pool_id=5, seed=3, prompts_per_file=12, task={"mix": [
        {"type": "reasoning_gym", "dataset": "chain_sum", "weight": 2.0},
        {"type": "dataset", "name": "qa", "path": str(data), "verifier": "numeric",
         "sha256": data_digest(data)},
        {"type": "code", "sandbox": SANDBOX},
    ]})


def test_the_mix_is_published_pinned_and_regenerated(rules) -> None:
    published = PoolRules.model_validate_json(rules.model_dump_json())  # what GET /rules gives
    assert published == rules and published.digest() == rules.digest()
    a = Assignment(rules, "0xAa", 1, 2)
    b = Assignment(published, "0xaa", 1, 2)
    worker, validator = rules.task.build(), published.task.build()
    problems = a.problems(worker)
    assert problems == b.problems(validator)
    assert {p.task for p in problems} == {"rg/chain_sum", "qa", "code"}
    for p in problems:
        if p.task == "qa":
            assert compute_reward(p, f"it is {p.answer}", 4, validator).task == 1.0
        if p.task == "rg/chain_sum":
            assert compute_reward(p, f"<answer>{p.answer}</answer>", 4, validator).task == 1.0
    assert rules_drift(RulesPins.of(published), rules) == []


def test_a_pin_on_a_tasks_leaf_names_it(rules) -> None:
    pins = RulesPins.of(rules).model_dump()
    pins["task"]["mix"][2]["sandbox"]["cpu_s"] = 2
    pins["task"]["mix"][0]["config"] = {"max_terms": 3}
    drift = rules_drift(RulesPins.model_validate(pins), rules)
    assert drift == ["rules.task.mix.0.config.max_terms: configured 3, the pool publishes None",
                     "rules.task.mix.2.sandbox.cpu_s: configured 2, the pool publishes 1"]


def test_other_data_than_the_pools_is_refused(rules, tmp_path) -> None:
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(DatasetError, match="differs from the pinned"):
        rules.task.build()


def test_a_rule_reading_a_workers_disk_must_pin_the_data(tmp_path) -> None:
    keystore = tmp_path / "key.jsonl"
    keystore.write_text('{"crypto": "secret", "address": "0x1"}\n')
    steal = {"type": "dataset", "path": str(keystore), "template": "{crypto}",
             "answer_field": "address"}
    with pytest.raises(ValueError, match=r"task.mix.0 \(dataset\) reads .*key.jsonl.*: a pool's "
                                         r"rule pins the data's sha256"):
        PoolRules(pool_id=1, task=steal)
    with pytest.raises(ValueError, match=r"task.mix.0 \(code\) reads"):
        PoolRules(pool_id=1, task={"type": "code", "path": str(keystore)})
    assert PoolRules(pool_id=1, task={"type": "code"}).task.mix[0].path == "meshrl:code_small.jsonl"
    with pytest.raises(ValueError, match=r"sandbox\.bwrap must name the bwrap binary"):
        PoolRules(pool_id=1, task={"type": "code", "sandbox": {"bwrap": "/bin/sh"}})
    with pytest.raises(ValueError, match="env"):
        PoolRules(pool_id=1, task={"type": "verifiers", "env": "os.path"})
