"""Ctrl-C of `meshrl train`, as a terminal sends it: SIGINT to the whole process group (the
generation child included). The run stops with exit status 130 and one line saying where it
was and what it kept: no traceback from the child, no broken pipe. A stopped warm start keeps
its progress: the next `meshrl train` of the run continues it from the next step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]  # two `meshrl train` processes at once

# A terminal's shell starts its foreground job with SIGINT at its default; a job started in the
# background of a non-interactive shell (`cmd &`, as some CI runners and scripts start a test
# run) inherits SIGINT ignored, and Python then never installs its Ctrl-C handler. The run is
# started as a terminal would start it, whatever started the tests.
_AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["--run.progress", "false", "--run.plot", "false", "--eval.num_problems", "4",
        "--rollout.prompts_per_step", "2", "--rollout.group_size", "2",
        "--rollout.max_new_tokens", "3", "--filter_groups", "false"]
PHASES = {
    # a warm start that never ends by itself, stopped after its first evaluated step
    "warm start": (["--sft.max_steps", "100000", "--sft.eval_every", "1",
                    "--sft.target_accuracy", "1", "--sft.max_accuracy", "1",
                    "--sft.batch_size", "2", "--steps", "5"], "sft"),
    # RL with the generator in a child process, stopped after its first step
    "rl": (["--sft.max_steps", "0", "--steps", "100000", "--rollout.subprocess", "true"],
           "step"),
}


def _train(run: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", _AS_FROM_A_TERMINAL, "-m", "meshrl.cli", "train", "--run.dir",
            str(run), "--run.name", "r", *TINY, *args]


def _records(run: Path) -> list[dict]:
    path = run / "r" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _interrupt(tmp: Path, phase: str) -> tuple[int, str, float]:
    args, kind = PHASES[phase]
    run = tmp / phase.replace(" ", "_")
    proc = subprocess.Popen(
        _train(run, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)}, start_new_session=True)
    metrics = run / "r" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while not (metrics.is_file() and any(
                json.loads(line).get("kind") == kind for line in metrics.read_text().splitlines()
                if line.strip())):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, f"no {kind!r} record in time"
            time.sleep(0.2)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as a terminal's Ctrl-C
        _, err = proc.communicate(timeout=120)  # make test loads the machine (xdist)
        return proc.returncode, err, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stop")


@pytest.fixture(scope="module")
def stopped(tmp: Path) -> dict[str, tuple[int, str, float]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(PHASES, pool.map(lambda p: _interrupt(tmp, p), PHASES), strict=True))


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_of_train_is_one_line_and_exit_130(phase: str, stopped) -> None:
    rc, err, seconds = stopped[phase]
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert "Traceback" not in err and "Broken pipe" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert rc == 130, err[-3000:]
    assert lines[0].startswith("meshrl train: interrupted during "), lines[0]
    if phase == "warm start":  # its progress is kept, and the line says where
        assert "warm start: its progress is saved at step " in lines[0], lines[0]
        assert "resumes the warm start from step " in lines[0], lines[0]
    else:
        assert "starts the run over" in lines[0], lines[0]  # no checkpoint was written yet
    assert seconds < 20  # the child is not waited for through a whole batch


def test_a_stopped_warm_start_is_continued_by_the_next_run(stopped, tmp: Path) -> None:
    _, err, _ = stopped["warm start"]
    saved = int(err.split("its progress is saved at step ")[1].split()[0])
    run = tmp / "warm_start"
    before = _records(run)
    # the same run again, its warm start ending one step after the saved one, no RL steps
    res = subprocess.run(_train(run, "--sft.max_steps", str(saved + 1), "--sft.eval_every", "1",
                                "--sft.target_accuracy", "1", "--sft.max_accuracy", "1",
                                "--sft.batch_size", "2", "--steps", "0"),
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert res.returncode == 0, res.stderr[-3000:]
    after = _records(run)[len(before):]
    assert after[0]["kind"] == "warm_start_resume" and after[0]["step"] == saved, after[:2]
    sft = [r["step"] for r in after if r["kind"] == "sft"]
    assert sft == [saved + 1], sft  # no step trained or evaluated again, none skipped
    warm = next(r for r in after if r["kind"] == "warm_start")
    assert warm["steps"] == saved + 1  # the policy handed to RL is the continued one
