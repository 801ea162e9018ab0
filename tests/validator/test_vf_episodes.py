"""A multi-turn verifiers environment's episodes (issue #45) judged on a real worker's files:
its `@vf.tool` function runs in meshrl's sandbox through the worker's real episode loop, the
validator re-runs every call and the file is accepted; a lying tool output edited into the
file is a hard finding. The policy is `episodes.caller_model` walking calls of the `sq` tool
(`<sq>44</sq>`) of the fixture environment `meshrl_vf_square`."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from episodes import caller_model
from helpers import claim, honest_file, roundtrip

from meshrl.inference import CPUEngine, EngineConfig
from meshrl.pool import Check, PoolRules, VerdictKind
from meshrl.tasks import EnvironmentConfig, TasksConfig, VerifiersEpisodeConfig, compute_reward
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file
from meshrl.wire.rollout_file import RolloutFile, segments

ENVS = str(Path(__file__).parents[1] / "tasks" / "vf_envs")  # importable like installed ones
ENGINE = ReplayConfig(thresholds=profile_thresholds("meshrl-cpu-engine"))
# `= -> <,  < -> s | /,  / -> s,  s -> q,  q -> >,  > -> 4 | EOS,  4 -> 4 | <`: calls such as
# `<sq>44</sq>` after a prompt ending in "=", answered `<result>1936</result>`
SQ_WALK = {"=": "<", "<": "s/", "/": "s", "s": "q", "q": ">", ">": "4\x00", "4": "4<"}


@pytest.fixture(scope="module", autouse=True)
def installed():
    sys.path.insert(0, ENVS)
    yield
    sys.path.remove(ENVS)


@pytest.fixture(scope="module")
def rules(installed) -> PoolRules:
    env = EnvironmentConfig(env="meshrl_vf_square", episode=VerifiersEpisodeConfig(
        max_turns=3, max_tool_tokens=24))
    return PoolRules(pool_id=1, seed=7, prompts_per_file=3, group_size=4,
                     task=TasksConfig(mix=[env]), proof_profile="meshrl-cpu-engine",
                     sampling={"max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0})


@pytest.fixture(scope="module")
def caller(tok):
    return CPUEngine(caller_model(tok, SQ_WALK), tok, EngineConfig(num_threads=1))


@pytest.fixture(scope="module")
def honest(caller, tok, rules) -> RolloutFile:
    return honest_file(caller, tok, rules)


def _judge(caller, tok, rules, rf):
    rf = roundtrip(rf)[0]
    return verify_file(caller, tok, rf, claim(rf), rules, rules.task.build(), ENGINE)


def _answered(rf: RolloutFile, tok) -> tuple[int, object]:
    """The first row with a tool output that answered (exit 0) and its segment."""
    for i, row in enumerate(rf.completions):
        for s in segments(row):
            if not s.model and s.exit == 0:
                return i, s
    raise AssertionError("the sq caller made no answered call in this file")


def test_an_environments_tool_episode_validates(caller, tok, rules, honest):
    """The environment's own tool function, run in the sandbox by the worker's episode loop:
    its outputs are the squares of the calls, the validator's re-runs match token for token,
    and the reward is the environment's, on the conversation (a tool message: 0.25)."""
    i, env = _answered(honest, tok)
    row = honest.completions[i]
    text = tok.decode(row.completion_tokens[:env.end])
    call = text.rsplit("<sq>", 1)[1].split("</sq>")[0]
    assert env.tool == "sq"
    assert tok.decode(row.completion_tokens[env.start:env.end]) == \
        f"<result>{int(call) ** 2}</result>"
    d = _judge(caller, tok, rules, honest)
    assert d.accepted and d.kind is VerdictKind.ACCEPT, d.reason
    tasks = rules.task.build()
    task = tasks.tasks["vf/meshrl_vf_square"]
    problem = task.problem_at(3)
    assert compute_reward(problem, "<sq>3</sq><result>9</result>9", 2, tasks).task == 1.0
    assert compute_reward(problem, "9", 2, tasks).task == 0.75
    assert compute_reward(problem, "<sq>3</sq><result>9</result>8", 2, tasks).task == 0.25


def test_a_lying_tool_output_is_a_hard_finding(caller, tok, rules, honest):
    """One digit of an answered call's output changed in the file: the re-run differs."""
    rf = copy.deepcopy(honest)
    i, env = _answered(rf, tok)
    ids = rf.completions[i].completion_tokens
    j = env.start + len("<result>")
    ids[j] = tok.stoi[str((int(tok.decode(ids[j:j + 1])) + 1) % 10)]
    d = _judge(caller, tok, rules, rf)
    assert d.kind is VerdictKind.HARD_INVALID and Check.EPISODE in d.checks, d.reason
    assert "'sq' output differs from the tool's re-run" in d.reason
