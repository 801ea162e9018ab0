"""pass@k in held-out evaluation: the unbiased estimator against a naive reference, and
evaluate's sampled pass@k against the same samples drawn and scored by hand."""

import itertools
import json

import pytest

from meshrl.inference import SamplingParams, build_backend
from meshrl.model import CharTokenizer, build_model
from meshrl.pool import encode_prompt
from meshrl.rl.config import EvalConfig
from meshrl.rl.evaluate import evaluate, heldout_problems, pass_at_k
from meshrl.tasks import TasksConfig

TOK = CharTokenizer()


def test_pass_at_k_is_the_mean_over_k_subsets() -> None:
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                hits = [i < c for i in range(n)]
                subsets = list(itertools.combinations(hits, k))
                naive = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(naive, abs=1e-12), (n, c, k)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="pass_samples 2 is below the largest pass_k 4"):
        EvalConfig(pass_k=[4, 1], pass_samples=2)
    assert EvalConfig(pass_k=[4, 1, 4]).pass_k == [1, 4] and EvalConfig(pass_k=[2]).samples() == 2


def test_evaluate_pass_at_k_matches_samples_scored_by_hand(tmp_path, one_torch_thread) -> None:
    gen = build_backend("engine", build_model("qwen2-tiny", TOK.vocab_size, seed=0), TOK)
    n, s = 6, 5
    prompts = [f"q{i}=" for i in range(n)]
    params = SamplingParams(max_new_tokens=1, temperature=1.0, seed=3)
    outs = gen.generate([encode_prompt(TOK, p) for p in prompts for _ in range(s)], params,
                        seq_ids=list(range(n * s)))
    texts = [[TOK.decode(outs[i * s + j].token_ids).strip() for j in range(s)] for i in range(n)]
    answers = [texts[i][i % s] for i in range(n)]  # at least one sample of each is correct
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": p, "answer": a}) + "\n"
                            for p, a in zip(prompts, answers, strict=True)))
    tasks = TasksConfig.model_validate({"mix": [{"type": "dataset", "path": str(data),
                                                 "heldout_fraction": 0.0}]}).build()
    problems = [tasks.tasks["dataset"].problem_at(i) for i in range(n)]
    cfg = dict(max_new_tokens=1, pass_k=[1, 2, 4], pass_samples=s, pass_temperature=1.0,
               pass_seed=3)
    got = evaluate(gen, TOK, problems, tasks, EvalConfig(batch_size=64, **cfg))
    correct = [sum(t == a for t in ts) for ts, a in zip(texts, answers, strict=True)]
    assert min(correct) >= 1
    for k in (1, 2, 4):
        want = sum(pass_at_k(s, c, k) for c in correct) / n
        assert got[f"pass@{k}"] == pytest.approx(want)
    assert got["pass@1"] == pytest.approx(sum(correct) / (n * s))
    assert got["pass@1"] <= got["pass@2"] <= got["pass@4"]
    # sampling is keyed by (seed, seq id): any chunking gives the same pass@k
    assert evaluate(gen, TOK, problems, tasks, EvalConfig(batch_size=7, **cfg)) == got
    assert "pass@1" not in evaluate(gen, TOK, problems, tasks, EvalConfig(max_new_tokens=1))


def test_heldout_problems_come_from_the_heldout_split(tmp_path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "a"}) + "\n"
                            for i in range(50)))
    tasks = TasksConfig.model_validate({"mix": [{"type": "dataset", "path": str(data),
                                                 "heldout_fraction": 0.2}]}).build()
    task = tasks.tasks["dataset"]
    held = heldout_problems(tasks, EvalConfig(num_problems=5))
    assert len(held) == 5 and {p.meta["index"] for p in held} <= set(task.heldout)


class _Asked:
    """A real backend that also keeps the prompts it was asked to generate from."""

    def __init__(self, backend) -> None:
        self.backend, self.prompts = backend, []

    def generate(self, prompts, params, seq_ids=None):
        self.prompts.extend(prompts)
        return self.backend.generate(prompts, params, seq_ids=seq_ids)


def test_pass_at_k_encodes_prompts_by_the_prompt_format(tmp_path, one_torch_thread) -> None:
    """Greedy accuracy and pass@k see the same prompts: with `chat`, the chat template's, not
    the raw text's (a chat-trained policy read 0.9 greedy and 0.0 pass@1 when they differed)."""
    from hf_families import save_family
    from meshrl.model import load_model, load_tokenizer

    d = save_family("qwen3-tied", tmp_path / "m")
    tok = load_tokenizer(d)
    gen = _Asked(build_backend("engine", load_model(d), tok))
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"what is {i}?", "answer": str(i)}) + "\n"
                            for i in range(3)))
    tasks = TasksConfig.model_validate({"mix": [{"type": "dataset", "path": str(data),
                                                 "heldout_fraction": 0.0}]}).build()
    problems = [tasks.tasks["dataset"].problem_at(i) for i in range(3)]
    evaluate(gen, tok, problems, tasks, EvalConfig(max_new_tokens=2, pass_k=[1, 2]), "chat")
    chat = [encode_prompt(tok, p.prompt, "chat") for p in problems]
    assert chat != [encode_prompt(tok, p.prompt, "raw") for p in problems]
    assert gen.prompts == chat + [c for c in chat for _ in range(2)]
