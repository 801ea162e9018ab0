"""Math word problems from a local JSONL or Parquet file, graded with `math-verify`.

Rows need a problem field (`problem` | `question` | `prompt`) and an answer field (`answer` |
`solution`, the latter's last \\boxed{} is used). Nothing is downloaded: point `path` at a file.
`sha256` pins the file (`meshrl.tasks.dataset.data_digest`): a file whose bytes hash to another
digest is refused when the task is built, so a validator never grades by other data than the
worker's (a pool's rules must pin it).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.base import Problem, Task
from meshrl.tasks.dataset import DatasetError, check_digest, data_path, math_verify_score

__all__ = ["MathConfig", "MathTask", "load_math_rows"]

_PROBLEM_KEYS = ("problem", "question", "prompt")
_ANSWER_KEYS = ("answer", "solution", "final_answer")


class MathConfig(Config):
    type: Literal["math"] = "math"
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    path: str = Field(..., description="local .jsonl or .parquet file of problems")
    template: str = Field(
        "{problem}\nPut the final answer in \\boxed{{}}.\n", description="prompt template"
    )
    timeout_s: float = Field(5.0, gt=0, le=600, description="math-verify deadline per answer "
                             "(killed past it; an answer it cannot score in time scores 0)")
    sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$", description="the file's "
                               "digest (`meshrl.tasks.dataset.data_digest`): every role "
                               "refuses another file (required in a pool's rules)")

    def build(self) -> MathTask:
        return MathTask(self)


def load_math_rows(path: str | Path) -> list[tuple[str, str]]:
    """(problem, answer) pairs from a JSONL or Parquet file; clear errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"math task file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow's errors are many types; one line names the file
            raise DatasetError(f"{path}: not a readable Parquet file ({e})") from None
    else:
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{i}: invalid JSON ({e.msg})") from None
    out = []
    for i, row in enumerate(rows, 1):
        problem = next((row[k] for k in _PROBLEM_KEYS if k in row), None)
        answer = next((row[k] for k in _ANSWER_KEYS if k in row), None)
        if problem is None or answer is None:
            raise DatasetError(f"{path}: row {i} lacks a problem or answer field: {sorted(row)}")
        out.append((str(problem), str(answer)))
    if not out:
        raise DatasetError(f"{path}: no problems")
    return out


class MathTask(Task):
    name = "math"

    def __init__(self, cfg: MathConfig) -> None:
        self.cfg = cfg
        path = data_path(cfg.path)
        check_digest(path, cfg.sha256)  # before reading: never grade by another file
        self.rows = load_math_rows(path)  # once, when the run builds its tasks

    def sample(self, rng: random.Random) -> Problem:
        index = rng.randrange(len(self.rows))
        problem, answer = self.rows[index]
        prompt = self.cfg.template.format(problem=problem)
        return Problem(self.name, prompt, answer, {"index": index})

    def scores_in_child(self) -> bool:
        return True  # math-verify, in the killable child

    def score(self, problem: Problem, completion: str) -> float:
        return math_verify_score(problem.answer, completion, self.cfg.timeout_s)
