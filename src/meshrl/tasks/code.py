"""Code tasks: the answer is a Python program, scored by hidden stdin/stdout tests run in the
bubblewrap sandbox (tasks/sandbox.py).

A data row is `{"prompt": str, "tests": [{"input": str, "output": str}, ...]}` (JSONL,
Parquet or a datasets directory, like any dataset on disk). The program is the last fenced
```python block of the completion (or the whole completion when it has none). It scores 1.0
only when every test passes: exit status 0 and stdout equal to the expected output token for
token (whitespace-split), each test a fresh sandboxed process under the task's limits; the first
failure ends the grading. The tests never enter the prompt, so a program that prints an example's
output without computing it fails the hidden ones.

Limits are part of the task (and so of the pool's rules): a validator re-runs every program
under the same ones. Keep them generous against the tests, so an honest program never lands
near a limit where a slower machine would time it out.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.base import Problem, RowsTask
from meshrl.tasks.dataset import DatasetError, check_digest, data_path, load_rows
from meshrl.tasks.sandbox import SandboxConfig, check_sandbox, run_sandboxed

__all__ = ["CODE_DATA", "CodeConfig", "CodeTask", "data_path", "extract_program"]

CODE_DATA = "meshrl:code_small.jsonl"  # shipped data: the same name on every machine

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_MAX_TESTS = 64


def extract_program(completion: str) -> str:
    """The last fenced code block of `completion`, or all of it when it has none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


class CodeConfig(Config):
    type: Literal["code"] = "code"
    name: str = Field("code", min_length=1, max_length=64, description="the task's name in "
                      "the mix (distinct per task)")
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    path: str = Field(CODE_DATA, description="rows {prompt, tests: [{input, output}]}: a local "
                      ".jsonl/.parquet file or a datasets directory; `meshrl:NAME` is a file "
                      "shipped in meshrl/tasks/data (default: the generated set)")
    template: str = Field("{prompt}\nWrite a Python program that reads stdin and prints the "
                          "answer, in a ```python block.\n", description="prompt template "
                          "over the row's `prompt`")
    heldout_fraction: float = Field(0.1, ge=0, lt=1, description="rows kept for evaluation")
    sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$", description="the data's "
                               "digest (`meshrl.tasks.dataset.data_digest`): every role "
                               "refuses other data")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="limits of each "
                                   "test's run")

    def build(self) -> CodeTask:
        return CodeTask(self)


def _tests(path: str, i: int, row: dict) -> list[tuple[str, str]]:
    tests = row.get("tests")
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError:
            tests = None
    if not isinstance(row.get("prompt"), str) or not isinstance(tests, list) or not tests:
        raise DatasetError(f"code dataset {path}: row {i} needs a string 'prompt' and a "
                           f"non-empty 'tests' list")
    out = []
    for t in tests[:_MAX_TESTS]:
        if not (isinstance(t, dict) and isinstance(t.get("input"), str)
                and isinstance(t.get("output"), str)):
            raise DatasetError(f"code dataset {path}: row {i} has a test that is not "
                               f"{{input: str, output: str}}")
        out.append((t["input"], t["output"]))
    return out


class CodeTask(RowsTask):
    """Programs graded by hidden tests in the sandbox (refuses to build without one)."""

    def __init__(self, cfg: CodeConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        path = data_path(cfg.path)
        check_digest(path, cfg.sha256)
        rows = load_rows(path)
        if not rows:
            raise DatasetError(f"code dataset {cfg.path}: no rows")
        self.rows = [(str(r.get("prompt")), _tests(cfg.path, i, r))
                     for i, r in enumerate(rows, 1)]
        self.split_rows(len(self.rows), cfg.heldout_fraction)
        check_sandbox(cfg.sandbox)  # no sandbox here: refuse now, never run code without one

    def problem_at(self, index: int) -> Problem:
        prompt, tests = self.rows[index]
        answer = json.dumps([{"input": i, "output": o} for i, o in tests])
        return Problem(self.name, self.cfg.template.format(prompt=prompt), answer,
                       {"index": index})

    def score(self, problem: Problem, completion: str) -> float:
        program = extract_program(completion)
        for stdin, expected in self.rows[int(problem.meta["index"])][1]:
            res = run_sandboxed(program, stdin, self.cfg.sandbox)
            if res.timed_out or res.output_capped or res.returncode != 0:
                return 0.0
            if res.stdout.split() != expected.split():
                return 0.0
        return 1.0
