"""Every `meshrl` command, given bad input, answers with one line naming the problem and a
non-zero exit status: never a Python traceback. A new command must add its case here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meshrl.cli import build_parser, main

DEAD_URL = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.extend(_leaves(sub, (*prefix, name)))
    return out or [prefix]


def _cases(tmp: Path) -> dict[tuple[str, ...], tuple[list[str], str]]:
    """command -> (bad arguments, a phrase the one-line error must contain)."""
    missing = str(tmp / "missing")
    a_file = tmp / "a_file"
    # a dead endpoint is given up on after 0.3 s, not the 5 s default (the error is the same)
    chain = ["--chain.deployment", str(tmp / "nodeploy.json"), "--chain.rpc_url", DEAD_URL,
             "--chain.ready_timeout_s", "0.3"]
    return {
        ("model", "init"): (["--preset", "nope", "--out", str(tmp / "m")], "nope"),
        ("model", "import"): ([missing, "--out", str(tmp / "m")], "missing"),
        ("train",): (["--model.path", missing, "--run.dir", str(tmp / "runs"),
                      "--run.progress", "false"], "missing"),
        ("eval",): (["--checkpoint", missing], "missing"),
        ("inference", "generate"): (["--model", missing, "--prompts", '["1+1="]'], "missing"),
        ("toploc", "calibrate"): (["--model_dir", missing, "--out", str(tmp / "c.json")],
                                  "missing"),
        ("shardcast", "publish"): (["--src", missing, "--root", str(tmp / "o")], "missing"),
        ("shardcast", "origin"): (["--root", str(a_file)], "a_file"),
        ("shardcast", "relay"): (["--root", str(a_file), "--upstreams", f'["{DEAD_URL}"]',
                                  "--publisher", "0x" + "11" * 20, "--run", "pool-1"],
                                 "a_file"),
        ("shardcast", "fetch"): (["--out", str(tmp / "x"), "--server.urls", f'["{DEAD_URL}"]',
                                  "--client.wait_timeout", "0.3", "--client.max_attempts", "1"],
                                 "did not appear in time"),
        ("chain", "node"): (["--anvil", missing, *chain], "anvil not found"),
        ("chain", "deploy"): (chain, "127.0.0.1:9"),
        ("chain", "status"): (chain, "nodeploy.json"),
        ("chain", "register"): (chain, "nodeploy.json"),
        ("chain", "stake"): (chain, "nodeploy.json"),
        ("chain", "mint"): ([*chain, "--to", "0x" + "11" * 20], "nodeploy.json"),
        ("chain", "create-pool"): (chain, "nodeploy.json"),
        ("chain", "balances"): (chain, "nodeploy.json"),
        ("chain", "works"): (chain, "nodeploy.json"),
        ("chain", "propose-federator"): ([*chain, "--to", "0x" + "22" * 20], "nodeploy.json"),
        ("chain", "accept-federator"): (chain, "nodeploy.json"),
        ("chain", "send"): ([*chain, "--to", "0x" + "11" * 20, "--ether", "1"],
                            "nodeploy.json"),
        ("chain", "rewards"): ([*chain, "--provider", "0x" + "11" * 20], "nodeploy.json"),
        ("chain", "claim"): ([*chain, "--chain.key_file", missing], "nodeploy.json"),
        ("chain", "disputes"): (chain, "nodeploy.json"),
        ("chain", "challenge"): ([*chain, "--work_id", "0x12"], "work_id"),
        ("chain", "vote"): ([*chain, "--work_id", "ab" * 32], "nodeploy.json"),
        ("chain", "settle"): (chain, "set --work_id"),
        ("chain", "rpc-filter"): (["--port", "70000"], "port"),
        ("keys", "new"): (["--dir", str(tmp / "k"), "--password_file", missing], "missing"),
        ("chain", "compile"): (["--contracts", "x"], "unknown key 'contracts'"),
        ("chain", "devnet"): (chain, "127.0.0.1:9"),
        ("network", "up"): (["--anvil", missing, "--dir", str(tmp / "net")], "anvil not found"),
        ("dashboard",): (["--port", "70000"], "port"),
        ("discovery",): ([*chain, "--db", str(tmp / "d.db")], "nodeploy.json"),
        ("orchestrator",): ([*chain, "--db", str(tmp / "o.db")], "nodeploy.json"),
        ("worker",): ([*chain, "--work_dir", str(tmp / "w")], "127.0.0.1:9"),
        ("worker-join",): ([DEAD_URL, "--work_dir", str(tmp / "wj")], "unreachable"),
        ("validator",): ([*chain, "--work_dir", str(tmp / "v")], "127.0.0.1:9"),
        ("adversary-worker",): ([*chain, "--work_dir", str(tmp / "aw"), "--cheat.mode", "int8"],
                                "127.0.0.1:9"),
        ("adversary-validator",): ([*chain, "--work_dir", str(tmp / "av"),
                                    "--rogue.mode", "accuse-honest"], "127.0.0.1:9"),
    }


def test_every_command_has_a_bad_input_case(tmp_path: Path) -> None:
    assert sorted(_leaves(build_parser())) == sorted(_cases(tmp_path))


@pytest.mark.parametrize("command", sorted(_cases(Path("/nonexistent"))), ids=" ".join)
def test_bad_input_is_one_line_and_nonzero(command, tmp_path: Path, capsys) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    args, phrase = _cases(tmp_path)[command]
    code = main([*command, *args])
    err = capsys.readouterr().err
    # structured log lines (JSON) may come before it; the error itself is one plain line
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert code in (1, 2), err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"meshrl {' '.join(command)}: "), lines[0]
    assert phrase in lines[0], lines[0]


def test_config_errors_exit_2_and_name_the_key(tmp_path: Path, capsys) -> None:
    assert main(["train", "--trainer.steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "meshrl train: invalid config: unknown key 'trainer.steps'"
        " (did you mean 'trainer.warmup_steps'?)")
    assert main(["eval", str(tmp_path / "nope.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Bad input found while a command runs (not when its config is parsed), as a user meets it: the
# installed `meshrl` in a process of its own, one line on stderr, exit status 2, no traceback.

MESHRL = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "meshrl"
TINY_TRAIN = ["--steps", "1", "--sft.max_steps", "0", "--run.progress", "false"]


def _mix(**task: str) -> list[str]:
    fields = ", ".join(f"{k} = {json.dumps(v)}" for k, v in task.items())
    return ["--tasks.mix", f"[{{{fields}}}]"]


def _runtime_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (meshrl arguments, a phrase the one line must contain)."""
    no_answer = _mix(type="dataset", path=str(tmp / "qa.jsonl"), template="{q}")
    no_split = _mix(type="dataset", path=str(tmp / "hfdict"), split="dev")
    unknown_gym = _mix(type="reasoning_gym", dataset="no_such_gym_set")
    no_env = _mix(type="verifiers", env="no_such_env_installed")
    gpt2, missing = str(tmp / "gpt2"), str(tmp / "no_model_here")
    train = ["train", "--run.dir", str(tmp / "runs"), *TINY_TRAIN]
    return {
        "train dataset without its answer field": ([*train, *no_answer],
                                                   "row 1 has no field 'answer'"),
        "train missing split": ([*train, *no_split], "no split 'dev'"),
        "train unknown reasoning-gym dataset": ([*train, *unknown_gym],
                                                "unknown dataset 'no_such_gym_set'"),
        "train verifiers environment not installed": ([*train, *no_env], "is not installed"),
        "train unsupported model_type": ([*train, "--model.path", gpt2],
                                         "unsupported architecture model_type 'gpt2'"),
        "train missing model directory": ([*train, "--model.path", missing],
                                          f"model directory {missing} does not exist"),
        "train flag without its value": (["train", "--steps"], "--steps needs a value"),
        "eval dataset without its answer field": (["eval", "--checkpoint", gpt2, *no_answer],
                                                  "row 1 has no field 'answer'"),
        "eval unsupported model_type": (["eval", "--checkpoint", gpt2],
                                        "unsupported architecture model_type 'gpt2'"),
        "eval missing model directory": (["eval", "--checkpoint", missing],
                                         f"model directory {missing} does not exist"),
        "generate unsupported model_type": (["inference", "generate", "--model", gpt2,
                                             "--prompts", '["1+1="]'],
                                            "unsupported architecture model_type 'gpt2'"),
        "generate missing model directory": (["inference", "generate", "--model", missing,
                                              "--prompts", '["1+1="]'],
                                             f"model directory {missing} does not exist"),
        "generate flag without its value": (["inference", "generate", "--prompts", '["1"]',
                                             "--n"], "--n needs a value"),
    }


@pytest.fixture(scope="module")
def runtime_results(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, str]]:
    """Every case's process, run a few at a time (most of each is importing torch)."""
    import datasets

    tmp = tmp_path_factory.mktemp("runtime")
    (tmp / "qa.jsonl").write_text('{"q": "1+1", "a": "2"}\n{"q": "2+2", "a": "4"}\n')
    rows = [{"question": "1+1", "answer": "2"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp / "hfdict"))
    (tmp / "gpt2").mkdir()
    (tmp / "gpt2" / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}

    def run(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([str(MESHRL), *args], capture_output=True, text=True, env=env,
                              cwd=tmp, timeout=300)

    cases = _runtime_cases(tmp)
    with ThreadPoolExecutor(max_workers=6) as pool:
        done = dict(zip(cases, pool.map(run, [args for args, _ in cases.values()]),
                        strict=True))
    return {name: (done[name], phrase) for name, (_, phrase) in cases.items()}


@pytest.mark.slow  # a process per case, each importing torch (minutes in all): not in test-fast
@pytest.mark.parametrize("case", sorted(_runtime_cases(Path("/nonexistent"))))
def test_bad_input_found_at_run_time_is_one_line_exit_2(case: str, runtime_results) -> None:
    proc, phrase = runtime_results[case]
    lines = [line for line in proc.stderr.splitlines()
             if line.strip() and not line.startswith("{")]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    command = "inference generate" if case.startswith("generate") else case.split()[0]
    assert lines[0].startswith(f"meshrl {command}: "), lines[0]
    assert phrase in lines[0], lines[0]
    assert proc.returncode == 2, proc.stderr[-3000:]


@pytest.mark.parametrize("command, key", [("worker", "cheat.mode=int8"),
                                          ("validator", "rogue.mode=accuse-honest")])
def test_the_honest_roles_refuse_an_adversarys_mode(command, key, capsys) -> None:
    """`meshrl worker` / `meshrl validator` are honest: a cheat or rogue mode runs only as
    `meshrl adversary ...` (meshrl/adversaries), so no honest process ever runs one."""
    name, value = key.split("=")
    assert main([command, f"--{name}", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"meshrl {command}: {name} = {value!r} runs only as `meshrl adversary "
                   f"{command}`" + err.split(f"{command}`", 1)[1])
    assert "Traceback" not in err and len(err.splitlines()) == 1
