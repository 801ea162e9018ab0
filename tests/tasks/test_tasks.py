import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshrl.config import ConfigError, load_config
from meshrl.tasks import (
    ArithmeticConfig,
    MathConfig,
    ReverseConfig,
    TasksConfig,
    compute_reward,
    get_task,
    problem_seed,
    sample_problems,
)


def test_arithmetic_problems_are_correct() -> None:
    task = get_task("arithmetic", digits=3, operators="+-*")
    rng = random.Random(0)
    for _ in range(300):
        p = task.sample(rng)
        assert p.prompt.endswith("=")
        assert str(eval(p.prompt[:-1])) == p.answer  # the prompt is a Python expression
        assert int(p.answer) >= 0
        assert task.score(p, p.answer) == 1.0 and task.score(p, p.answer + "0") == 0.0


def test_reverse_task() -> None:
    task = get_task("reverse", min_length=2, max_length=4)
    p = task.sample(random.Random(1))
    text = p.prompt[len("rev:"):-1]
    assert 2 <= len(text) <= 4 and p.answer == text[::-1]
    assert task.score(p, p.answer) == 1.0


def test_sampling_is_a_pure_function_of_its_inputs() -> None:
    cfg = TasksConfig(mix=[ArithmeticConfig(), ReverseConfig(weight=2.0)]).build()
    a = sample_problems(cfg, 7, "0xAbC", 3, 5, 32)
    assert a == sample_problems(cfg, 7, "0xabc", 3, 5, 32)  # addresses are case-insensitive
    for other in [(8, "0xabc", 3, 5), (7, "0xabd", 3, 5), (7, "0xabc", 4, 5), (7, "0xabc", 3, 6)]:
        assert sample_problems(cfg, *other, 32) != a
    assert {p.task for p in a} == {"arithmetic", "reverse"}
    assert problem_seed(1, "n", 2, 3) == problem_seed(1, "n", 2, 3) < 2**64


def test_length_target_reward() -> None:
    cfg = TasksConfig(length_target={"enabled": True, "targets": [10], "alpha": 0.01}).build()
    (p,) = sample_problems(cfg, 0, "n", 0, 0, 1)
    assert p.meta["target_length"] == 10 and "about 10 tokens" in p.prompt
    r = compute_reward(p, p.answer, 4, cfg)
    assert (r.task, r.length, r.total) == (1.0, pytest.approx(-0.06), pytest.approx(0.94))
    r = compute_reward(p, "nope", 10, cfg)
    assert (r.task, r.length, r.total) == (0.0, 0.0, 0.0)


def test_math_task_from_jsonl_and_parquet(tmp_path: Path) -> None:
    rows = [{"problem": "What is 1/2 as a decimal?", "answer": "0.5"},
            {"question": "Simplify 2x+3x", "solution": "We get \\boxed{5x}."}]
    jl = tmp_path / "m.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows))
    table = pa.Table.from_pylist([{"problem": "1+1?", "answer": "2"}])
    pq.write_table(table, tmp_path / "m.parquet")
    task = MathConfig(path=str(jl)).build()
    probs = {task.sample(random.Random(s)).answer: task.sample(random.Random(s))
             for s in range(20)}
    half = probs["0.5"]
    assert "\\boxed{}" in half.prompt
    assert task.score(half, "so it is \\boxed{\\frac{1}{2}}") == 1.0
    assert task.score(half, "\\boxed{0.25}") == 0.0
    assert task.score(half, "\\boxed{\\frac{1}{") == 0.0  # malformed LaTeX is just wrong
    five_x = probs["We get \\boxed{5x}."]
    assert task.score(five_x, "The answer is $\\boxed{5x}$") == 1.0
    ptask = MathConfig(path=str(tmp_path / "m.parquet")).build()
    assert ptask.score(ptask.sample(random.Random(0)), "\\boxed{2}") == 1.0


def test_math_task_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):  # when the run builds its tasks, not mid-run
        TasksConfig(mix=[MathConfig(path=str(tmp_path / "missing.jsonl"))]).build()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x"}\n')
    with pytest.raises(ValueError, match="lacks a problem or answer"):
        MathConfig(path=str(bad)).build()
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: invalid JSON"):
        MathConfig(path=str(bad)).build()


def test_math_task_file_is_pinned_by_sha256(tmp_path: Path) -> None:
    """A pinned math file builds; the same path with other bytes is refused with one line
    naming the file and both digests (a validator never grades by another file than the
    worker's); a pool's rules refuse a math task without the pin."""
    from meshrl.pool import RulesSpec
    from meshrl.tasks.dataset import DatasetError, data_digest

    jl = tmp_path / "m.jsonl"
    jl.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    pin = data_digest(jl)
    assert pin == hashlib.sha256(jl.read_bytes()).hexdigest()
    task = MathConfig(path=str(jl), sha256=pin).build()
    assert task.score(task.sample(random.Random(0)), "\\boxed{2}") == 1.0
    assert MathConfig(path=str(jl), sha256=pin.upper()).build().rows == task.rows
    jl.write_text(json.dumps({"problem": "1+1?", "answer": "3"}) + "\n")
    with pytest.raises(DatasetError) as e:
        MathConfig(path=str(jl), sha256=pin).build()
    assert str(e.value) == (f"dataset {jl}: sha256 {data_digest(jl)[:16]}... differs from the "
                            f"pinned {pin[:16]}... (another file than the pool's)")
    with pytest.raises(ValueError, match="sha256"):
        MathConfig(path=str(jl), sha256="abc")  # not a digest: refused at load
    with pytest.raises(ValueError, match=r"task\.mix\.0 \(math\) reads .*pins the data's "
                       r"sha256"):
        RulesSpec(task={"type": "math", "path": str(jl)})
    assert RulesSpec(task={"type": "math", "path": str(jl), "sha256": data_digest(jl)})


def test_tasks_are_built_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A math task reads its file when the run builds its tasks, never per problem or reward;
    the sampling and reward functions refuse a config (which they would have to rebuild)."""
    import meshrl.tasks.math as math_task

    jl = tmp_path / "m.jsonl"
    jl.write_text("\n".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)})
                            for i in range(50)))
    reads: list[str] = []
    real = math_task.load_math_rows
    monkeypatch.setattr(math_task, "load_math_rows", lambda p: reads.append(str(p)) or real(p))
    cfg = TasksConfig(mix=[MathConfig(path=str(jl)), ArithmeticConfig()])
    tasks = cfg.build()
    assert reads == [str(jl)]
    problems = [p for step in range(20) for p in sample_problems(tasks, 0, "n", step, 0, 16)]
    rewards = [compute_reward(p, p.answer, 3, tasks).task for p in problems]
    assert {p.task for p in problems} == {"math", "arithmetic"}
    assert rewards == [1.0] * len(problems)
    assert reads == [str(jl)]  # 320 problems drawn and scored, one read
    with pytest.raises(TypeError, match="TaskSet"):
        sample_problems(cfg, 0, "n", 0, 0, 1)
    with pytest.raises(TypeError, match="TaskSet"):
        compute_reward(problems[0], "1", 1, cfg)


def test_tasks_config_from_toml(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[[mix]]\ntype = "arithmetic"\ndigits = 3\n[[mix]]\ntype = "reverse"\n'
                 "weight = 0.5\n")
    cfg = load_config(TasksConfig, [f])
    assert [type(m).__name__ for m in cfg.mix] == ["ArithmeticConfig", "ReverseConfig"]
    f.write_text('[[mix]]\ntype = "arithmetic"\ndigitz = 3\n')
    with pytest.raises(ConfigError, match="digitz"):
        load_config(TasksConfig, [f])
    with pytest.raises(ValueError, match="operators"):
        ArithmeticConfig(operators="/")
    with pytest.raises(KeyError, match="unknown task"):
        get_task("chess")


def test_sampling_seed_is_pinned_and_apart_from_the_problem_seed():
    from meshrl.tasks import problem_seed, sampling_seed

    s = sampling_seed(7, "0xAB", 3, 1)
    assert s == sampling_seed(7, "0xab", 3, 1) == 7929646625896259613  # case-insensitive
    assert s != problem_seed(7, "0xAB", 3, 1)
    assert len({sampling_seed(7, "0xab", 3, c) for c in range(100)}) == 100
    assert 0 <= s < 2**64
