"""A single-turn verifiers environment installed as a package is a task: its taskset's tasks
and its rewards, run by the worker and re-run by a validator's own build; environments that
need network (an LLM judge) or a runtime, and ones not installed, are one-line refusals."""

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
    # multi-turn: its calculator is an MCP toolset served by the environment's harness
    with pytest.raises(VerifiersEnvError, match=r"'meshrl_vf_tools' is multi-turn with tools "
                                                r"\['Calc'\]: MCP toolsets .* no validator can "
                                                "re-run exactly") as e:
        EnvironmentConfig(env="meshrl_vf_tools").build()
    assert "\n" not in str(e.value)
    with pytest.raises(VerifiersEnvError, match="'meshrl_vf_absent' is not installed"):
        EnvironmentConfig(env="meshrl_vf_absent").build()
    with pytest.raises(VerifiersEnvError, match="bad config: cnt: Extra inputs"):
        EnvironmentConfig(env="meshrl_vf_add", config={"cnt": 3}).build()
