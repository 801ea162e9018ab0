"""Code tasks in the bubblewrap sandbox: honest programs pass, hostile ones score 0 and harm
nothing, and a machine without the sandbox refuses instead of running code unsandboxed."""

import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import time
from pathlib import Path

import pytest

import meshrl.tasks.code as code_module
from meshrl.tasks import (
    CodeConfig,
    DatasetError,
    SandboxConfig,
    SandboxUnavailable,
    TasksConfig,
    compute_reward,
    extract_program,
    run_sandboxed,
    sample_problems,
)
from meshrl.tasks.code import CODE_DATA, data_path

if shutil.which("bwrap") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI needs bubblewrap (apt-get install bubblewrap; .ci/run does it)")
    pytest.skip("bubblewrap is not installed", allow_module_level=True)

FAST = SandboxConfig(cpu_s=1, wall_s=3.0, memory_mb=256, processes=8, output_bytes=4096)
SUM = "n = int(input())\nprint(sum(map(int, input().split())))\n"


@pytest.fixture(scope="module")
def task() -> code_module.CodeTask:
    return CodeConfig(sandbox=FAST, heldout_fraction=0.0).build()


def sum_problem(task: code_module.CodeTask):  # the first row is "print the sum"
    assert "sum" in task.rows[0][0]
    return task.problem_at(0)


def fenced(src: str) -> str:
    return f"Here it is:\n```python\n{src}```\n"


def test_honest_program_passes_and_a_wrong_one_fails(task) -> None:
    p = sum_problem(task)
    assert task.score(p, fenced(SUM)) == 1.0
    assert task.score(p, fenced(SUM.replace("sum(", "max("))) == 0.0
    assert task.score(p, "no code at all") == 0.0


def test_extract_program_takes_the_last_block() -> None:
    assert extract_program("```python\na\n```\ntext\n```py\nb\n```") == "b\n"
    assert extract_program("print(1)") == "print(1)"


def test_shipped_data_is_hardcode_proof_and_solvable(task) -> None:
    rows = [json.loads(line) for line in data_path(CODE_DATA).read_text().splitlines()]
    assert len(rows) == len(task.rows) >= 30
    for row in rows:
        # no single printed answer passes every hidden test of a row
        assert len({t["output"] for t in row["tests"]}) >= 2, row["prompt"]


def test_printing_an_expected_output_without_computing_scores_zero(task) -> None:
    p = sum_problem(task)
    first = json.loads(p.answer)[0]["output"]
    assert task.score(p, fenced(f"print({first.strip()!r})\n")) == 0.0


@pytest.mark.timing
def test_infinite_loop_scores_zero_within_the_wall_clock(task) -> None:
    t = time.monotonic()
    assert task.score(sum_problem(task), fenced("while True:\n    pass\n")) == 0.0
    assert time.monotonic() - t < FAST.wall_s + 2
    res = run_sandboxed("import time\ntime.sleep(60)\n", "", FAST.model_copy(
        update={"wall_s": 0.5}))
    assert res.timed_out and res.returncode != 0


def _nobody_processes() -> int:
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                n += (d / "status").read_text().count("Uid:\t65534\t") > 0
    return n


@pytest.mark.timing
def test_fork_bomb_scores_zero_and_leaves_no_process(task) -> None:
    before = _nobody_processes()
    bomb = ("import os\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass\n")
    t = time.monotonic()
    assert task.score(sum_problem(task), fenced(bomb)) == 0.0
    assert time.monotonic() - t < FAST.wall_s + 2
    # the sandbox's processes are reaped within a moment; poll rather than sleep a fixed time
    # (a sandbox another test process runs at the same time is counted too, so a lone leftover
    # must persist for the whole deadline to fail the test)
    deadline = time.monotonic() + 5
    while _nobody_processes() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _nobody_processes() <= before


def test_huge_allocation_scores_zero(task) -> None:
    hog = "x = bytearray(10 * 2**30)\n" + SUM
    assert task.score(sum_problem(task), fenced(hog)) == 0.0
    res = run_sandboxed("try:\n    bytearray(10 * 2**30)\n    print('got 10 GB')\n"
                        "except MemoryError:\n    print('refused')\n", "", FAST)
    assert res.stdout.strip() == "refused"


def test_secrets_outside_the_sandbox_are_invisible(tmp_path) -> None:
    keystore = tmp_path / "keystore.json"
    keystore.write_text('{"secret": "hunter2-private-key"}')
    for target in ("/etc/passwd", "/etc/hostname", str(keystore), str(Path.home()),
                   str(Path(code_module.__file__))):
        prog = (f"import os\ntry:\n    p = {target!r}\n"
                f"    print('LEAK', os.listdir(p) if os.path.isdir(p) else open(p).read())\n"
                f"except OSError:\n    print('blocked')\n")
        res = run_sandboxed(prog, "", FAST)
        assert res.stdout.strip() == "blocked", (target, res.stdout[:200])
    assert "hunter2" not in run_sandboxed(
        f"print(open({str(keystore)!r}).read())", "", FAST).stdout


def test_no_network() -> None:
    server = socket.create_server(("127.0.0.1", 0))  # the kernel completes connects unaccepted
    port = server.getsockname()[1]
    prog = (f"import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), "
            f"timeout=1)\n    print('connected')\nexcept OSError:\n    print('blocked')\n"
            f"try:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\n"
            f"    print('internet')\nexcept OSError:\n    print('blocked')\n")
    res = run_sandboxed(prog, "", FAST)
    assert res.stdout.split() == ["blocked", "blocked"]
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nobody connected to the host's loopback
        server.accept()
    server.close()


def test_writes_outside_tmp_fail_and_tmp_is_private(tmp_path) -> None:
    target = tmp_path / "pwned"
    prog = ("import os\nfor p in [" + repr(str(target)) + ", '/usr/pwned', '/pwned', '/dev/pwned', "
            "'/sandbox/main.py']:\n    try:\n        open(p, 'w').write('x')\n"
            "        print('wrote', p)\n    except OSError:\n        print('blocked')\n"
            "open('/tmp/mine', 'w').write('ok')\nprint(open('/tmp/mine').read())\n")
    res = run_sandboxed(prog, "", FAST)
    assert res.stdout.split() == ["blocked"] * 5 + ["ok"]
    assert not target.exists() and not Path("/usr/pwned").exists()
    assert not Path("/pwned").exists() and not Path("/tmp/mine").exists()


def test_exit_before_the_tests_and_patching_the_harness_score_zero(task) -> None:
    p = sum_problem(task)
    assert task.score(p, fenced("import sys\nsys.exit(0)\n" + SUM)) == 0.0
    grader = Path(code_module.__file__)
    digest = hashlib.sha256(grader.read_bytes()).hexdigest()
    patcher = ("import builtins, os, signal, sys\n"
               "for p in [" + repr(str(grader)) + ", '/sandbox/main.py']:\n"
               "    try:\n        open(p, 'w').write('def score(*a): return 1.0')\n"
               "    except OSError:\n        pass\n"
               "try:\n    import meshrl.tasks.code as c\n    c.CodeTask.score = lambda *a: 1.0\n"
               "except ImportError:\n    pass\n"
               "try:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n"
               "builtins.print = lambda *a, **k: None\nprint('PASS')\n")
    assert task.score(p, fenced(patcher)) == 0.0
    assert hashlib.sha256(grader.read_bytes()).hexdigest() == digest
    assert task.score(p, fenced(SUM)) == 1.0  # the grader still grades


def test_output_flood_is_capped(task) -> None:
    res = run_sandboxed("while True:\n    print('a' * 1000)\n", "", FAST)
    assert res.output_capped and len(res.stdout) <= FAST.output_bytes
    assert task.score(sum_problem(task), fenced("while True:\n    print('16')\n")) == 0.0


def test_a_missing_sandbox_binary_refuses() -> None:
    gone = SandboxConfig(bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="bubblewrap binary '/nonexistent/bwrap' not"):
        run_sandboxed("print(1)", "", gone)
    with pytest.raises(SandboxUnavailable, match="never run unsandboxed"):
        CodeConfig(sandbox=gone).build()
    with pytest.raises(SandboxUnavailable, match="not a file under /usr"):
        run_sandboxed("print(1)", "", SandboxConfig(python="/nonexistent/python3"))


def test_bad_code_rows_are_one_line_errors(tmp_path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"prompt": "x", "tests": []}) + "\n")
    with pytest.raises(DatasetError, match="row 1 needs a string 'prompt' and a non-empty"):
        CodeConfig(path=str(f), sandbox=FAST).build()


def test_validator_rebuild_regenerates_and_rescores_the_same(task) -> None:
    cfg = TasksConfig.model_validate({"mix": [{"type": "code", "sandbox": FAST.model_dump()}]})
    worker, validator = cfg.build(), cfg.build()  # two processes' builds of the same rule
    a = sample_problems(worker, 7, "0xAbC", 3, 1, 6, version=2)
    b = sample_problems(validator, 7, "0xabc", 3, 1, 6, version=2)
    assert a == b and len({p.prompt for p in a}) > 1
    rng = random.Random(0)
    for p in a[:3]:
        text = fenced(SUM) if "sum" in p.prompt and "digits" not in p.prompt else \
            rng.choice(["print(0)", "```python\nimport sys; sys.exit(0)\n```"])
        assert compute_reward(p, text, 10, worker) == compute_reward(p, text, 10, validator)
