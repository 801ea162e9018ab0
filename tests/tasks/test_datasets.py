"""Datasets on disk: JSONL, Parquet and a datasets directory give the same problems; verifiers;
the held-out split; one-line errors for bad input."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshrl.tasks import DatasetConfig, DatasetError, TasksConfig, compute_reward, sample_problems
from meshrl.tasks.dataset import heldout_rows, numeric_score

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3}
        for i in range(40)]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    import datasets

    tmp_path = tmp_path_factory.mktemp("datasets")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    hf = tmp_path / "hf"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(hf))
    hfdict = tmp_path / "hfdict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:3])}).save_to_disk(str(hfdict))
    return {"jsonl": str(jsonl), "parquet": str(parquet), "hf": str(hf),
            "hfdict": str(hfdict)}


def test_three_formats_give_the_same_problems(paths) -> None:
    seen = []
    for path in paths.values():
        tasks = TasksConfig.model_validate({"mix": [{"type": "dataset", "path": path,
                                                     "template": "Q: {question} (L{level})"}]})
        seen.append(sample_problems(tasks.build(), 3, "0xabc", 1, 0, 12, version=1))
    assert all(s == seen[0] for s in seen)
    p = seen[0][0]
    i = p.meta["index"]
    assert p.prompt == f"Q: What is {i} + {i}? (L{i % 3})" and p.answer == str(2 * i)
    test = DatasetConfig(path=paths["hfdict"], split="test").build()
    assert len(test.rows) == 3
    with pytest.raises(DatasetError, match=r"no split 'dev'; it has \['test', 'train'\]"):
        DatasetConfig(path=paths["hfdict"], split="dev").build()


def test_verifiers(paths) -> None:
    exact = DatasetConfig(path=paths["jsonl"]).build()
    numeric = DatasetConfig(path=paths["jsonl"], verifier="numeric").build()
    mv = DatasetConfig(path=paths["jsonl"], verifier="math-verify").build()
    p = exact.problem_at(7)
    assert p.answer == "14"
    assert exact.score(p, " 14\n") == 1.0 and exact.score(p, "14.0") == 0.0
    assert numeric.score(p, "so the sum is 14.0") == 1.0
    assert numeric.score(p, "14 or maybe 15") == 0.0  # the last number counts
    assert numeric.score(p, "no number") == 0.0
    assert mv.score(p, "The answer is $\\boxed{14}$") == 1.0
    assert mv.score(p, "The answer is $\\boxed{15}$") == 0.0
    assert numeric_score("1,000", "1000") == 1.0 and numeric_score("-0.5", "x = -.5") == 1.0
    assert numeric_score("2", "1e400") == 0.0


def test_heldout_split_is_disjoint_and_used_for_evaluation_only(paths) -> None:
    path = paths["jsonl"]
    cfg = TasksConfig.model_validate({"mix": [{"type": "dataset", "path": path,
                                               "heldout_fraction": 0.25}]})
    task = cfg.build()
    t = task.tasks["dataset"]
    assert set(t.train).isdisjoint(t.heldout) and len(t.train) + len(t.heldout) == 40
    assert 4 <= len(t.heldout) <= 16
    train = {p.meta["index"] for c in range(30) for p in
             sample_problems(task, 0, "n", 0, c, 16)}
    held = {p.meta["index"] for c in range(30) for p in
            sample_problems(task, 0, "n", 0, c, 16, heldout=True)}
    assert train == set(t.train) and held == set(t.heldout)
    assert heldout_rows(40, 0.25, "dataset") == set(t.heldout)  # a pure function
    assert heldout_rows(40, 0.0, "x") == set() and len(heldout_rows(2, 0.01, "x")) == 1


def test_bad_datasets_are_one_line_errors(tmp_path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "q", "solution": "4"}) + "\n")
    with pytest.raises(DatasetError, match=r"row 1 has no field 'answer' \(it has "
                                           r"\['question', 'solution'\]\)"):
        DatasetConfig(path=str(f)).build()
    assert DatasetConfig(path=str(f), answer_field="solution").build().rows
    with pytest.raises(DatasetError, match="row 1 has no field 'prompt'"):
        DatasetConfig(path=str(f), answer_field="solution", template="{prompt}").build()
    f.write_text('{"question": 1}\nnot json\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: invalid JSON"):
        DatasetConfig(path=str(f)).build()
    with pytest.raises(DatasetError, match="no such file or directory"):
        DatasetConfig(path=str(tmp_path / "nope.jsonl")).build()
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"unknown format '\.csv'"):
        DatasetConfig(path=str(tmp_path / "d.csv")).build()
    (tmp_path / "somedir").mkdir()
    with pytest.raises(DatasetError, match="not a datasets save_to_disk one"):
        DatasetConfig(path=str(tmp_path / "somedir")).build()


def test_two_datasets_in_one_mix_need_distinct_names(paths) -> None:
    path = paths["jsonl"]
    with pytest.raises(ValueError, match="'dataset' appears twice"):
        TasksConfig.model_validate({"mix": [{"type": "dataset", "path": path},
                                            {"type": "dataset", "path": path}]}).build()
    tasks = TasksConfig.model_validate({"mix": [
        {"type": "dataset", "path": path, "name": "a"},
        {"type": "dataset", "path": path, "name": "b", "verifier": "numeric"}]}).build()
    ps = sample_problems(tasks, 0, "n", 0, 0, 32)
    assert {p.task for p in ps} == {"a", "b"}
    p = next(p for p in ps if p.task == "b")
    assert compute_reward(p, f"it is {p.answer}", 3, tasks).task == 1.0


def test_a_shipped_dataset_is_named_meshrl_colon_name(tmp_path) -> None:
    """`meshrl:NAME` (the form a pool's rules take without a digest) resolves to the file
    shipped in meshrl/tasks/data, for a dataset task as for a code task."""
    from meshrl.pool import PoolRules
    from meshrl.tasks.data.make_small_sums import rows

    cfg = TasksConfig.model_validate({"mix": [{
        "type": "dataset", "name": "sums", "path": "meshrl:small_sums.jsonl",
        "template": "{question} Answer with just the number.", "verifier": "numeric",
        "heldout_fraction": 0.2}]})
    t = cfg.build().tasks["sums"]
    assert t.rows == rows()  # the generator is seeded: the shipped file is what it writes
    assert len(t.rows) == 2500 and len({r["question"] for r in t.rows}) == 2500
    held = {t.rows[i]["question"] for i in t.heldout}
    assert 400 <= len(held) <= 600 and held.isdisjoint(t.rows[i]["question"] for i in t.train)
    p = t.problem_at(0)
    assert p.prompt == "What is 32 + 23? Answer with just the number." and p.answer == "55"
    assert t.score(p, "32 + 23 = 55") == 1.0 and t.score(p, "55 is not 56") == 0.0
    assert PoolRules(pool_id=1, task=cfg).task == cfg  # shipped: no digest to pin
    for bad in ("meshrl:", "meshrl:../x.jsonl", "meshrl:.hidden"):
        with pytest.raises(DatasetError, match="a shipped file is meshrl:NAME"):
            DatasetConfig(path=bad).build()
