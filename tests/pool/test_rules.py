"""The pool's rules: parsing, pins and drift, assignment, profiles and the verdict vocabulary,
by hand-checked values."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from meshrl.model import CharTokenizer
from meshrl.pool import (
    PROFILES,
    RULE_FIELDS,
    Assignment,
    Check,
    Finding,
    PoolRules,
    RulesPins,
    RulesSpec,
    Severity,
    VerdictKind,
    WorkOrder,
    changed_rules,
    decide,
    encode_prompt,
    give_up,
    prompt_of_row,
    rules_drift,
    tasks_config,
    unmet_profile,
)
from meshrl.pool.rules import _canonical
from meshrl.tasks import TasksConfig, sample_problems, sampling_seed

RULES = PoolRules(pool_id=3, task={"type": "arithmetic", "digits": 2}, group_size=4,
                  prompts_per_file=2, sampling={"max_new_tokens": 8, "temperature": 0.7},
                  seed=7, async_level=1, files_per_step=2, proof_profile="meshrl-cpu-engine")

# a value differing from RULES' for every rule field
DRIFTED = {"task": {"type": "arithmetic", "digits": 3}, "sampling": {"max_new_tokens": 9,
           "temperature": 0.7}, "group_size": 8, "prompts_per_file": 3, "files_per_step": 1,
           "async_level": 2, "seed": 8, "proof_profile": "any-hardware",
           "prompt_format": "chat",
           "policy_signer": "0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A",
           "replay": {"rows_fraction": 0.5}, "batch": {"files": 16}}


def test_task_specs_have_one_parser():
    one = tasks_config({"type": "arithmetic", "digits": 2})
    mix = tasks_config({"mix": [{"type": "arithmetic", "digits": 2}]})
    assert one == mix == RULES.task and isinstance(one, TasksConfig)
    assert tasks_config(one) is one
    with pytest.raises(ValidationError):
        tasks_config({"type": "no-such-task"})


def test_rules_are_typed_bounded_and_refuse_unknown_keys():
    assert RULES.sampling.temperature == 0.7 and RULES.sampling.top_p == 1.0
    assert RULES.rows_per_file() == 8
    with pytest.raises(ValidationError, match="extra"):
        PoolRules(pool_id=1, tempo=3)
    with pytest.raises(ValidationError, match=r"sampling\.temperature"):
        PoolRules(pool_id=1, sampling={"temperature": float("nan")})
    with pytest.raises(ValidationError):
        PoolRules(pool_id=1, sampling={"top_p": 0.0})
    with pytest.raises(ValidationError):
        PoolRules(pool_id=1, proof_profile="gpu")
    with pytest.raises(ValidationError):  # frozen: a rule read once is never edited in place
        RULES.seed = 1  # type: ignore[misc]
    # the wire carries them as JSON and back, exactly
    assert PoolRules.model_validate_json(RULES.model_dump_json()) == RULES
    order = WorkOrder(rules=RULES, step=4, policy_versions=[3, 4], shardcast_servers=[],
                      max_file_bytes=10, max_units_per_file=10)
    assert WorkOrder.model_validate_json(order.model_dump_json()).rules == RULES


def test_every_rule_field_is_covered_by_the_drift_matrix():
    assert set(DRIFTED) == set(RULE_FIELDS) == set(RulesPins.model_fields)
    assert set(RULE_FIELDS) | {"pool_id"} == set(PoolRules.model_fields)


@pytest.mark.parametrize("field", sorted(DRIFTED))
def test_a_pin_that_differs_names_its_field(field):
    drift = rules_drift(RulesPins.model_validate({field: DRIFTED[field]}), RULES)
    assert len(drift) == 1 and drift[0].startswith(f"rules.{field}"), drift
    assert "configured" in drift[0] and "the pool publishes" in drift[0]


def test_drift_names_the_leaf_and_unset_pins_take_the_published_value():
    assert rules_drift(RulesPins(), RULES) == []
    assert rules_drift(RulesPins.of(RULES), RULES) == []
    [line] = rules_drift(RulesPins(task={"type": "arithmetic", "digits": 3}), RULES)
    assert line == "rules.task.mix.0.digits: configured 3, the pool publishes 2"
    [line] = rules_drift(RulesPins(sampling={"max_new_tokens": 8, "temperature": 1.0}), RULES)
    assert line == "rules.sampling.temperature: configured 1.0, the pool publishes 0.7"
    lines = rules_drift(RulesPins(seed=8, group_size=8), RULES)
    assert lines == ["rules.group_size: configured 8, the pool publishes 4",
                     "rules.seed: configured 8, the pool publishes 7"]


def test_rules_changed_while_running():
    assert changed_rules(RULES, RULES) is None
    why = changed_rules(RULES, RULES.model_copy(update={"seed": 9}))
    assert why == ("stopping, the pool's rules changed while running: rules.seed: started with "
                   "7, the pool now publishes 9")
    assert "pool_id" in changed_rules(RULES, RULES.model_copy(update={"pool_id": 4}))
    # a rule the role started without pins nothing, and is still a change when it appears
    signer = "0x19E7E376E7C213B7E7e7e46cc70A5dD086DAff2A"
    assert changed_rules(RULES, RULES.model_copy(update={"policy_signer": signer})) == (
        "stopping, the pool's rules changed while running: rules.policy_signer: started with "
        f"None, the pool now publishes '{signer}'")


def test_assignment_by_hand():
    tok = CharTokenizer()
    node = "0x" + "ab" * 20
    a = Assignment(RULES, node, counter=1, policy_version=4)
    tasks = RULES.task.build()
    problems = a.problems(tasks)
    # the version stands in the sampler's step place too: the problems and seed a file of
    # step = version always had
    assert problems == sample_problems(tasks, 7, node, 4, 1, 2, version=4)
    assert a.sampler_seed() == sampling_seed(7, node, 4, 1, version=4)
    # the version is part of the work: the same (node, counter) at another version is other
    # problems and other noise, so one generation can serve one claim only
    other = Assignment(RULES, node, counter=1, policy_version=3)
    assert other.problems(tasks) != problems and other.sampler_seed() != a.sampler_seed()
    rows = a.prompt_rows(tok, problems)
    assert len(rows) == 8 and rows[0] == rows[3] != rows[4] == rows[7]
    assert rows[0] == encode_prompt(tok, problems[0].prompt)
    assert [prompt_of_row(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.prompt_id(5) == "4/1/1"  # version/counter/prompt
    # the header names the rules by a digest of their canonical JSON: any change changes it
    assert len(RULES.digest()) == 64 and RULES.digest() == PoolRules.model_validate_json(
        RULES.model_dump_json()).digest()
    drifted = [PoolRules.model_validate({**RULES.model_dump(), k: DRIFTED[k]}) for k in DRIFTED]
    assert len({r.digest() for r in drifted} | {RULES.digest()}) == len(DRIFTED) + 1
    assert RULES.model_copy(update={"seed": 8}).digest() != RULES.digest()


def test_encode_prompt_puts_bos_first_when_there_is_one():
    tok = CharTokenizer()
    ids = encode_prompt(tok, "1+2=")
    assert ids == [tok.bos_token_id, *tok.encode("1+2=")]

    class NoBos:
        bos_token_id = None

        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    assert encode_prompt(NoBos(), "ab") == [97, 98]


def test_proof_profiles_and_the_compute_they_are_honest_for():
    assert set(PROFILES) == {"any-hardware", "meshrl-cpu-engine"}
    assert PROFILES["any-hardware"].thresholds == {}
    assert PROFILES["meshrl-cpu-engine"].thresholds["pooled_full_chunks"] == 1
    assert unmet_profile("any-hardware", "bfloat16", "reference") is None
    assert unmet_profile("meshrl-cpu-engine", "float32", "engine") is None
    why = unmet_profile("meshrl-cpu-engine", "bfloat16", "reference")
    assert why is not None and "holds only for float32 compute" in why
    with pytest.raises(KeyError, match="known: any-hardware, meshrl-cpu-engine"):
        unmet_profile("gpu", "float32", "engine")


def test_decisions_hard_beats_soft_beats_accept():
    ok = decide([])
    assert ok.kind is VerdictKind.ACCEPT and ok.accepted and ok.reason == "all checks passed"
    soft = Finding(Check.SCHEMA, Severity.SOFT, "bad footer")
    hard = Finding(Check.REWARDS, Severity.HARD, "3 of 8 rewards differ", {"bad_rows": 3})
    d = decide([soft, hard], {"rows": 8})
    assert d.kind is VerdictKind.HARD_INVALID and d.checks == (Check.REWARDS, Check.SCHEMA)
    assert d.reason == "rewards: 3 of 8 rewards differ; schema: bad footer"
    assert d.stats == {"rows": 8} and not d.accepted
    assert decide([soft]).kind is VerdictKind.SOFT_INVALID
    g = give_up("download: refused", 6)
    assert g.kind is VerdictKind.SOFT_INVALID and g.checks == (Check.VALIDATOR_ERROR,)
    assert "after 6 attempts: download: refused" in g.reason


def test_spec_without_pool_id_is_what_an_orchestrator_configures():
    spec = RulesSpec(seed=7)
    assert PoolRules(pool_id=1, **dict(spec)).seed == 7


def test_file_limits_follow_the_rules():
    from meshrl.pool import file_limits

    lim = file_limits(RULES, max_file_bytes=1 << 20, max_prompt_tokens=64)
    assert (lim.max_rows, lim.max_completion_tokens, lim.max_prompt_tokens, lim.max_bytes) == (
        8, 8, 64, 1 << 20)


def test_per_file_submission_keeps_the_digest_of_rules_from_before_batches():
    # an old pool's files name their rules by a digest without the batch rule: batch.files = 1
    # (per-file submission) leaves it out, any other batch rule is in it
    off = PoolRules(pool_id=1)
    assert "batch" not in json.loads(_canonical(off))
    on = PoolRules(pool_id=1, batch={"files": 16, "max_delay_s": 5.0})
    assert json.loads(_canonical(on))["batch"] == {"files": 16, "max_delay_s": 5.0}
    assert on.digest() != off.digest()
    with pytest.raises(ValidationError):
        PoolRules(pool_id=1, batch={"files": 257})  # more than the orchestrator takes
