"""reasoning-gym as a task source: any of its procedural datasets by name, with its own config,
scored by its own scorer.

reasoning-gym generates item `i` of a dataset built with seed `s` from `Random(s + i)`, whatever
the dataset's `size`, so an item is a pure function of (dataset, config, s + i). A problem draws
`i` from the assignment's RNG (the pool's seed and the node/step/counter/version), so a validator
that builds the same task regenerates exactly the worker's problems. Training items use the
seeds `seed .. seed + size - 1`, held-out items `seed + size .. seed + 2 * size - 1`: disjoint.
The answer is read from the completion's `<answer>...</answer>` tag (configurable) and passed
to the dataset's `score_answer`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import random
import re
from typing import Any, Literal

from pydantic import Field

from meshrl.config import Config
from meshrl.tasks.base import Problem, Task, TaskError

__all__ = ["GymConfig", "GymTask", "UnknownGymDataset"]


class UnknownGymDataset(TaskError):
    """A reasoning-gym dataset name or config that reasoning-gym does not know."""


class GymConfig(Config):
    type: Literal["reasoning_gym"] = "reasoning_gym"
    name: str | None = Field(None, min_length=1, max_length=64, description="the task's name "
                             "in the mix (default: rg/<dataset>)")
    weight: float = Field(1.0, gt=0, description="mixing weight among tasks")
    dataset: str = Field(..., min_length=1, description="a reasoning-gym dataset name, e.g. "
                         "'chain_sum'")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config "
                                   "fields (e.g. {min_terms = 2, max_terms = 3})")
    seed: int = Field(0, ge=0, lt=2**31, description="base seed of the dataset's items")
    size: int = Field(1_000_000, ge=1, le=2**30, description="distinct training items (as many "
                      "again are held out)")
    template: str = Field("{question}\nGive the final answer in <answer></answer> tags.\n",
                          description="prompt template over the item's `question`")
    answer_tag: str = Field("answer", max_length=32, description="tag the answer is read "
                            "from ('': the whole completion, stripped)")
    screen_answers: bool = Field(True, description="score 0, before the dataset's scorer "
                                 "sees it, an answer that scorer would run as code but no "
                                 "honest answer looks like (off: the scoring sandbox alone "
                                 "bounds it, and an answer can score its own row)")
    timeout_s: float = Field(5.0, gt=0, le=600, description="deadline of one answer's score "
                             "(scored in a child killed past it; an answer not scored in time "
                             "scores 0)")

    def build(self) -> GymTask:
        return GymTask(self)


def _create(cfg: GymConfig, seed: int) -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise UnknownGymDataset("reasoning_gym task: the reasoning-gym package is not "
                                "installed (pip install reasoning-gym)") from None
    from reasoning_gym.factory import DATASETS

    if cfg.dataset not in DATASETS:
        raise UnknownGymDataset(f"reasoning_gym task: unknown dataset {cfg.dataset!r} (see "
                                f"reasoning_gym.factory.DATASETS, {len(DATASETS)} known)")
    try:
        return reasoning_gym.create_dataset(cfg.dataset, seed=seed, size=cfg.size,
                                            **cfg.config)
    except (TypeError, ValueError, AssertionError) as e:
        raise UnknownGymDataset(f"reasoning_gym task {cfg.dataset!r}: bad config "
                                f"{cfg.config!r}: {e}") from None


class GymTask(Task):
    """Items of one reasoning-gym dataset, scored by the dataset's own `score_answer`."""

    def __init__(self, cfg: GymConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name or f"rg/{cfg.dataset}"
        self.splits = {"train": _create(cfg, cfg.seed), "heldout": _create(cfg, cfg.seed +
                                                                            cfg.size)}
        self._entry = functools.lru_cache(maxsize=4096)(self._generate)

    def _generate(self, split: str, index: int) -> dict[str, Any]:
        return self.splits[split][index]

    def _problem(self, split: str, index: int) -> Problem:
        entry = self._entry(split, index)
        prompt = self.cfg.template.format(question=entry["question"])
        return Problem(self.name, prompt, str(entry["answer"]), {"split": split,
                                                                  "index": index})

    def sample(self, rng: random.Random) -> Problem:
        return self._problem("train", rng.randrange(self.cfg.size))

    def sample_heldout(self, rng: random.Random) -> Problem:
        return self._problem("heldout", rng.randrange(self.cfg.size))

    def killable(self) -> tuple[dict[str, Any], float]:
        # `score_answer` is reasoning-gym's code on the worker's text: countdown's sympy
        # `parse_expr` of `9**9**9**9` never ends
        return self.cfg.model_dump(mode="json"), self.cfg.timeout_s

    def runs_answer_code(self) -> bool:
        # read off the dataset's own source (its class and reasoning-gym bases): 16 of the
        # 106 datasets of the pinned reasoning-gym can evaluate text (countdown, puzzle24, the
        # integrations, polynomial_multiplication, ...); the others parse numbers or strings
        return _may_run_text(type(self.splits["train"]))

    def warm(self, problem: Problem) -> None:
        # the item's regeneration (tens of ms for countdown) cached before the row's fork
        self._entry(str(problem.meta["split"]), int(problem.meta["index"]))

    def score(self, problem: Problem, completion: str) -> float:
        if not self.cfg.answer_tag:
            answer: str | None = completion.strip()
        else:
            from reasoning_gym.utils import extract_answer

            answer = extract_answer(completion, tag_name=self.cfg.answer_tag)
        entry = self._entry(str(problem.meta["split"]), int(problem.meta["index"]))
        dataset = self.splits[str(problem.meta["split"])]
        if self.cfg.screen_answers and answer is not None and not _admissible(type(dataset),
                                                                             answer):
            return 0.0
        try:
            score = float(dataset.score_answer(answer, entry))
        except Exception:  # a scorer choking on a hostile answer: a wrong answer, not a crash
            return 0.0
        return min(1.0, max(0.0, score)) if score == score else 0.0


# what in a scorer's module can run a completion's text as code, or start a process
_CODE = re.compile(r"parse_expr|sympify|\beval\(|\bexec\(|\bcompile\(|math_verify|subprocess"
                   r"|__import__|importlib")


@functools.cache
def _may_run_text(cls: type) -> bool:
    """Whether any reasoning-gym module of `cls` or its bases mentions a way to run text (a
    module whose source cannot be read counts as one that may)."""
    for k in cls.__mro__:
        module = inspect.getmodule(k)
        if module is None or not module.__name__.startswith("reasoning_gym"):
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            return True
        if _CODE.search(source):
            return True
    return False


# An answer a scorer runs as code could also make its own row score 1 (read the gold answer off
# the scorer's frame), in the worker, the validator and the trainer alike, and teach the policy
# to write code instead of answers. So before such a scorer sees it, an answer must be what an
# honest answer of its kind is: a Python literal, a bare word or text that does not compile
# where the scorer `eval`s it (binary_matrix, n_queens, spiral_matrix, string_insertion), an
# arithmetic expression in single-letter symbols and elementary functions where it goes to
# sympy (countdown, puzzle24, the integrations, polynomial_multiplication). Else it scores 0.
_MATH_NAMES = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot",
                         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln",
                         "sqrt", "pi", "Abs", "Integral", "oo"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_ARITHMETIC = re.compile(r"[^0-9A-Za-z+\-*/^().,=\s]|\.\s*[A-Za-z]")
MAX_SCREENED_ANSWER = 4096  # characters: an honest answer of these datasets is far shorter


@functools.cache
def _screen_of(cls: type) -> str:
    """"literal", "expression" or "" (no screen): what `cls.score_answer` does with the text."""
    try:
        source = inspect.getsource(cls.score_answer)
    except (OSError, TypeError):
        return ""
    if re.search(r"\beval\(\s*answer", source):
        return "literal"
    return "expression" if re.search(r"parse_expr|sympify", source) else ""


def _admissible(cls: type, answer: str) -> bool:
    """Whether `answer` may reach `cls.score_answer` (the module comment above)."""
    screen = _screen_of(cls)
    if not screen:
        return True
    if len(answer) > MAX_SCREENED_ANSWER:
        return False
    if screen == "literal":  # a literal, or text `eval` refuses to compile (its own format)
        try:
            tree = ast.parse(answer.strip(), mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return True
        if isinstance(tree.body, ast.Name):  # a bare word (string_insertion's): no call
            return True
        try:
            ast.literal_eval(tree)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
        return True
    if _NOT_ARITHMETIC.search(answer):
        return False
    return all(len(n) == 1 or n in _MATH_NAMES for n in _NAME.findall(answer))
