"""reasoning-gym datasets as tasks: problems regenerate exactly from the pool's seed and the
assignment (a validator's separate build included), scored by the dataset's own scorer."""

import pytest

from meshrl.tasks import (
    GymConfig,
    TasksConfig,
    UnknownGymDataset,
    compute_reward,
    sample_problems,
)

DATASETS = {"chain_sum": {"min_terms": 2, "max_terms": 3}, "spell_backward": {},
            "leg_counting": {"max_animals": 3}, "word_sorting": {}}


def mix() -> TasksConfig:
    return TasksConfig.model_validate({"mix": [
        {"type": "reasoning_gym", "dataset": d, "config": c} for d, c in DATASETS.items()]})


def test_validator_regenerates_the_workers_problems_for_several_datasets() -> None:
    worker, validator = mix().build(), mix().build()  # two independent builds of one rule
    a = sample_problems(worker, 11, "0xAB", 4, 2, 24, version=3)
    b = sample_problems(validator, 11, "0xab", 4, 2, 24, version=3)
    assert a == b
    assert {p.task for p in a} == {f"rg/{d}" for d in DATASETS}
    assert sample_problems(worker, 11, "0xab", 4, 3, 24, version=3) != a  # another counter
    assert sample_problems(worker, 12, "0xab", 4, 2, 24, version=3) != a  # another pool seed
    for p in a:
        good = f"thinking...<answer>{p.answer}</answer>"
        assert compute_reward(p, good, 5, worker).task == 1.0
        assert compute_reward(p, good, 5, validator).task == 1.0
        assert compute_reward(p, "<answer>certainly wrong 123</answer>", 5, worker).task < 1.0
        assert compute_reward(p, p.answer, 5, worker).task == 0.0  # no tag: no answer


def test_the_datasets_own_config_and_scorer() -> None:
    task = GymConfig(dataset="chain_sum", config={"min_terms": 2, "max_terms": 2,
                                                  "min_digits": 1, "max_digits": 1}).build()
    ps = sample_problems(TasksConfig(mix=[task.cfg]).build(), 0, "n", 0, 0, 20)
    for p in ps:
        expr = p.prompt.split(":")[-1].split("=")[0]
        assert len(expr.replace(" ", "").replace("+", " ").replace("-", " ").split()) == 2
        assert str(eval(expr)) == p.answer  # the prompt holds a Python expression
    raw = GymConfig(dataset="chain_sum", answer_tag="").build()
    p = raw.sample(__import__("random").Random(0))
    assert raw.score(p, f"  {p.answer} ") == 1.0


def test_heldout_items_are_disjoint_from_training_items() -> None:
    tasks = TasksConfig(mix=[GymConfig(dataset="spell_backward", size=50)]).build()
    train = {p.prompt for c in range(20) for p in sample_problems(tasks, 0, "n", 0, c, 8)}
    held = {p.prompt for c in range(20)
            for p in sample_problems(tasks, 0, "n", 0, c, 8, heldout=True)}
    assert train and held and len(train) <= 50
    assert {p.meta["split"] for p in sample_problems(tasks, 0, "n", 0, 0, 8, heldout=True)} \
        == {"heldout"}


def test_unknown_dataset_or_config_is_a_one_line_error() -> None:
    with pytest.raises(UnknownGymDataset, match="unknown dataset 'chain_summ'"):
        GymConfig(dataset="chain_summ").build()
    with pytest.raises(UnknownGymDataset, match="'chain_sum': bad config"):
        GymConfig(dataset="chain_sum", config={"bogus": 1}).build()


@pytest.mark.parametrize("dataset,cheat,unscreened", [
    # spiral_matrix / string_insertion `eval` the answer in their own frame, where the gold
    # answer is a local: 0.1 is the most their eval path gives
    ("spiral_matrix", "entry['answer'].split()", 0.1),
    ("string_insertion", "list(entry['answer'])", 0.1),
    # sympy's parse_expr runs Python: the right answer times (1 + (code's result != expected))
    ("simple_integration", "({gold})*(1+(('a'+'b')!=('ab')))", 1.0),
])
def test_an_answer_that_runs_code_cannot_score_its_own_row(dataset: str, cheat: str,
                                                           unscreened: float) -> None:
    """A scorer that runs the answer's text lets that text read the gold answer and score in
    the worker, the validator and the trainer alike (as it does with `screen_answers` off):
    such answers score 0 before the scorer sees them, while honest answers still score 1."""
    import random

    task = GymConfig(dataset=dataset).build()
    bare = GymConfig(dataset=dataset, screen_answers=False).build()
    rng = random.Random(0)
    for _ in range(20):
        p = task.sample(rng)
        code = f"<answer>{cheat.format(gold=p.answer)}</answer>"
        assert task.score(p, f"<answer>{p.answer}</answer>") == 1.0
        assert bare.score(p, code) == unscreened
        assert task.score(p, code) == 0.0
