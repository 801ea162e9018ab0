"""A verifiers environment installed as a package is a task: its taskset's tasks and its
rewards, run by the worker and re-run by a validator's own build; a multi-turn one whose tools
a validator re-runs (plain functions re-run in the sandbox, or mapped onto meshrl's tools) runs
episodes; environments that need network (an LLM judge), a runtime or a tool no validator can
re-run, and ones not installed, are one-line refusals."""

import shutil
from pathlib import Path

import pytest

from meshrl.tasks import (
    EnvironmentConfig,
    TasksConfig,
    VerifiersEnvError,
    compute_reward,
    sample_problems,
)

ENVS = str(Path(__file__).parent / "vf_envs")  # fixture packages, importable like installed ones


@pytest.fixture(autouse=True)
def installed(monkeypatch) -> None:
    monkeypatch.syspath_prepend(ENVS)


def test_environment_tasks_and_rewards_regenerate_on_the_validator() -> None:
    cfg = TasksConfig.model_validate({"mix": [
        {"type": "verifiers", "env": "meshrl_vf_add", "config": {"count": 40}},
        {"type": "arithmetic"}]})
    worker, validator = cfg.build(), cfg.build()
    a = sample_problems(worker, 5, "0xA", 1, 0, 16, version=1)
    assert a == sample_problems(validator, 5, "0xa", 1, 0, 16, version=1)
    env = [p for p in a if p.task == "vf/meshrl_vf_add"]
    assert env
    for p in env:
        i = p.meta["index"]
        assert p.prompt == f"Add.\n\n{i}+{2 * i}=" and p.answer == str(3 * i)
        assert compute_reward(p, p.answer, 2, worker).task == 1.0
        assert compute_reward(p, p.answer, 2, validator).task == 1.0
        assert compute_reward(p, str(3 * i + 1), 2, validator).task == 0.0  # weight-0 reward
    task = worker.tasks["vf/meshrl_vf_add"]
    assert len(task.items) == 40 and set(task.train).isdisjoint(task.heldout)


def test_refusals_are_one_line_errors() -> None:
    with pytest.raises(VerifiersEnvError, match="'meshrl_vf_judged' scores with an LLM judge "
                                                r"\(needs network\)"):
        EnvironmentConfig(env="meshrl_vf_judged").build()
    with pytest.raises(VerifiersEnvError, match=r"rewards \['tests_pass'\] need a runtime"):
        EnvironmentConfig(env="meshrl_vf_runtime").build()
    with pytest.raises(VerifiersEnvError, match="'meshrl_vf_absent' is not installed"):
        EnvironmentConfig(env="meshrl_vf_absent").build()
    with pytest.raises(VerifiersEnvError, match="bad config: cnt: Extra inputs"):
        EnvironmentConfig(env="meshrl_vf_add", config={"cnt": 3}).build()


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed")


@needs_bwrap
def test_a_multi_turn_environment_with_a_function_tool_is_a_task() -> None:
    """`meshrl_vf_tools`: its toolset's `multiply` (a standard-library module and a module
    constant, no state) is accepted: the task runs episodes with it, its problems describe the
    call, and the tool, re-run from its own source in the sandbox, answers the same on every
    run (errors included) and the environment's reward scores the final reply."""
    task = EnvironmentConfig(env="meshrl_vf_tools", template="{tools}\n{prompt}").build()
    assert task.episode is not None and [t.name for t in task.tools] == ["calc_multiply"]
    p = task.problem_at(0)
    assert p.prompt == "<calc_multiply>{JSON arguments: a, b}</calc_multiply> a times b\n7*8="
    tool = task.tools[0]
    assert tool.run('{"a": 7, "b": 8}', 1) == tool.run('{"a": 7, "b": 8}', 2)
    assert tool.run('{"a": 7, "b": 8}', 1).output == "56"
    big = tool.run('{"a": 70000, "b": 80000}', 1)
    assert (big.output, big.exit) == ("error: ValueError: 5600000000 is over 1000000000", 1)
    assert tool.run("7*8", 1).output == "error: the call is not JSON arguments"
    assert "unexpected keyword argument 'c'" in tool.run('{"a": 1, "b": 2, "c": 3}', 1).output
    assert task.score(p, '<calc_multiply>{"a": 7, "b": 8}</calc_multiply>'
                         '<result>56</result>56') == 1.0
    assert task.score(p, "55") == 0.0


@pytest.mark.parametrize(("kind", "tool", "why"), [
    ("state", "counter_count", r"its toolset keeps per-rollout state \(CountState\)"),
    ("web", "web_fetch", r"it reaches the network \(urllib\)"),
    ("clock", "clock_today", r"it reads the wall clock \(datetime\)"),
    ("self", "configured_where", r"it reads its toolset \(self"),
    ("helper", "helped_bump", r"it uses its module's '_helper'"),
    ("remote", "helped_bump", r"it is a remote MCP server at http://127.0.0.1:9/mcp"),
])
def test_a_tool_no_validator_can_rerun_is_refused_naming_it(kind, tool, why) -> None:
    with pytest.raises(VerifiersEnvError, match=f"'meshrl_vf_unreplayable': tool '{tool}' "
                                                f"refused: {why}.*no validator can re-run it "
                                                f"exactly") as e:
        EnvironmentConfig(env="meshrl_vf_unreplayable", config={"kind": kind}).build()
    assert "\n" not in str(e.value)


def test_a_tool_mapped_onto_a_meshrl_tool_is_served_by_it() -> None:
    """The stateful counter mapped onto meshrl's calculator: accepted, called as `<calc>`;
    a mapping of a tool the environment does not have is refused."""
    task = EnvironmentConfig(env="meshrl_vf_unreplayable", config={"kind": "state"},
                             episode={"tools": {"counter_count": {"name": "calc"}}}).build()
    assert [t.name for t in task.tools] == ["calc"]
    assert task.tools[0].run("6*7", 0).output == "42"
    with pytest.raises(VerifiersEnvError, match=r"maps \['nope'\], which it does not have"):
        EnvironmentConfig(env="meshrl_vf_unreplayable", config={"kind": "state"},
                          episode={"tools": {"counter_count": {"name": "calc"},
                                             "nope": {"name": "calc"}}}).build()
    with pytest.raises(VerifiersEnvError, match="tool 'web' refused: it queries the network"):
        EnvironmentConfig(env="meshrl_vf_unreplayable", config={"kind": "state"},
                          episode={"tools": {"counter_count": {"name": "web"}}}).build()
