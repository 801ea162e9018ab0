"""Problems from a dataset on disk: JSONL, Parquet or a Hugging Face `save_to_disk` directory.

A row becomes a prompt through a template (`str.format` over the row's fields) and is graded
against its answer field by a verifier: `exact` (whitespace-trimmed string equality),
`numeric` (the last number in the completion equals the answer, within a relative tolerance) or
`math-verify`. A fixed fraction of rows, chosen by a hash of their index, is the held-out split:
training draws only from the other rows, evaluation only from those. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from string import Formatter
from typing import Any, Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.base import Problem, RowsTask, TaskError, heldout_rows

__all__ = ["DatasetConfig", "DatasetError", "DatasetTask", "check_digest", "data_digest",
           "data_path", "heldout_rows", "load_rows", "math_verify_score", "numeric_score"]

Verifier = Literal["exact", "numeric", "math-verify"]
SHIPPED = Path(__file__).parent / "data"  # `meshrl:NAME`: the same file on every machine


class DatasetError(TaskError):
    """A dataset that cannot serve as a task (missing file, missing field, no rows)."""


def data_path(path: str | Path) -> Path:
    """A data path as written in a rule: `meshrl:NAME` names a file shipped in
    meshrl/tasks/data, anything else is a local path."""
    path = str(path)
    if path.startswith("meshrl:"):
        name = path.removeprefix("meshrl:")
        if not name or "/" in name or name.startswith("."):
            raise DatasetError(f"dataset {path!r}: a shipped file is meshrl:NAME")
        return SHIPPED / name
    return Path(path)


def load_rows(path: str | Path, split: str = "train") -> list[dict[str, Any]]:
    """The rows of a `.jsonl` / `.parquet` file or a `datasets` directory (`split` picks one
    split of a saved `DatasetDict`); errors name the file and the problem in one line."""
    path = Path(path)
    if path.is_dir():
        return _load_hf(path, split)
    if not path.is_file():
        raise DatasetError(f"dataset {path}: no such file or directory")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow's errors are many types; one line names the file
            raise DatasetError(f"dataset {path}: not a readable Parquet file ({e})") from None
    if path.suffix != ".jsonl":
        raise DatasetError(f"dataset {path}: unknown format {path.suffix!r} (want .jsonl, "
                           f".parquet or a datasets directory)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"dataset {path}:{i}: invalid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"dataset {path}:{i}: a row is a JSON object, got "
                                   f"{type(row).__name__}")
            rows.append(row)
    return rows


def data_digest(path: str | Path) -> str:
    """sha256 (hex) of a data file, or of a directory's files (relative names and bytes, in
    sorted order): what a pool's rule pins so every role reads the same data."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_digest(path: str | Path, sha256: str | None) -> None:
    """Refuse data whose digest differs from the pinned one (None: nothing pinned)."""
    if sha256 is not None and Path(path).exists():
        got = data_digest(path)
        if got != sha256.lower():
            raise DatasetError(f"dataset {path}: sha256 {got[:16]}... differs from the pinned "
                               f"{sha256[:16]}... (another file than the pool's)")


def _load_hf(path: Path, split: str) -> list[dict[str, Any]]:
    if not any((path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json")):
        raise DatasetError(f"dataset {path}: a directory but not a datasets save_to_disk one")
    import datasets

    ds = datasets.load_from_disk(str(path))  # local files only: nothing is downloaded
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DatasetError(f"dataset {path}: no split {split!r}; it has {sorted(ds)}")
        ds = ds[split]
    return ds.to_list()


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def numeric_score(answer: str, completion: str, rel_tol: float = 1e-6) -> float:
    """1.0 when the last number in `completion` equals `answer` (within `rel_tol`)."""
    gold = _number(answer.strip())
    found = _NUMBER.findall(completion)
    if gold is None or not found:
        return 0.0
    pred = _number(found[-1])
    if pred is None or not math.isfinite(pred):
        return 0.0
    return 1.0 if math.isclose(pred, gold, rel_tol=rel_tol, abs_tol=rel_tol) else 0.0


def math_verify_score(answer: str, completion: str, timeout_s: float) -> float:
    """1.0 when math-verify finds `completion`'s answer equivalent to `answer`; 0 when it
    cannot tell within `timeout_s` (the pool rule: an unscorable answer scores 0). Runs in a
    child process that is killed at the deadline (`meshrl.tasks.killable`): sympy can hold
    the GIL for minutes on one answer."""
    from meshrl.tasks.killable import math_verify_outcome

    return math_verify_outcome(answer, completion, timeout_s).score


class DatasetConfig(Config):
    type: Literal["dataset"] = "dataset"
    name: str = Field("dataset", min_length=1, max_length=64, description="the task's name in "
                      "the mix (distinct per task)")
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    path: str = Field(..., description="a local .jsonl or .parquet file or a datasets "
                      "save_to_disk directory; `meshrl:NAME` is a file shipped in "
                      "meshrl/tasks/data")
    split: str = Field("train", description="split of a saved DatasetDict")
    template: str = Field("{question}", description="prompt: str.format over the row's fields")
    answer_field: str = Field("answer", description="the row field holding the answer")
    verifier: Verifier = Field("exact", description="exact | numeric | math-verify")
    heldout_fraction: float = Field(0.1, ge=0, lt=1, description="rows kept for evaluation "
                                    "only (chosen by a hash of the row index)")
    timeout_s: float = Field(5.0, gt=0, le=600, description="math-verify deadline per answer "
                             "(killed past it; an answer it cannot score in time scores 0)")
    sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$", description="the data's "
                               "digest (`meshrl.tasks.dataset.data_digest`): set in a pool's "
                               "rules, every role refuses other data")

    def build(self) -> DatasetTask:
        return DatasetTask(self)


def _template_fields(template: str) -> set[str]:
    try:
        return {f.split(".")[0].split("[")[0] for _, f, _, _ in Formatter().parse(template)
                if f}
    except ValueError as e:
        raise DatasetError(f"dataset template {template!r}: {e}") from None


class DatasetTask(RowsTask):
    """Rows of a dataset on disk, split into training and held-out rows."""

    def __init__(self, cfg: DatasetConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        path = data_path(cfg.path)
        check_digest(path, cfg.sha256)
        rows = load_rows(path, cfg.split)
        if not rows:
            raise DatasetError(f"dataset {cfg.path}: no rows")
        need = {cfg.answer_field} | _template_fields(cfg.template)
        for i, row in enumerate(rows, 1):
            missing = sorted(need - set(row))
            if missing:
                raise DatasetError(f"dataset {cfg.path}: row {i} has no field "
                                   f"{', '.join(map(repr, missing))} (it has {sorted(row)})")
        self.rows = rows
        self.split_rows(len(rows), cfg.heldout_fraction)

    def problem_at(self, index: int) -> Problem:
        row = self.rows[index]
        prompt = self.cfg.template.format(**row)
        return Problem(self.name, prompt, str(row[self.cfg.answer_field]), {"index": index})

    def scores_in_child(self) -> bool:
        return self.cfg.verifier == "math-verify"

    def score(self, problem: Problem, completion: str) -> float:
        if self.cfg.verifier == "exact":
            return 1.0 if completion.strip() == problem.answer.strip() else 0.0
        if self.cfg.verifier == "numeric":
            return numeric_score(problem.answer, completion)
        return math_verify_score(problem.answer, completion, self.cfg.timeout_s)
