"""The reference backend (naive HF loop) and the engine keep one contract, token for token."""

from __future__ import annotations

import copy

import pytest
import torch

from meshrl.inference import (
    CPUEngine,
    EngineConfig,
    InferenceBackend,
    InvalidRequestError,
    ReferenceBackend,
    ReferenceConfig,
    SamplingParams,
    WeightLoadError,
)
from meshrl.model import build_model, save_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


CASES = {
    "greedy": SamplingParams(max_new_tokens=24, temperature=0),
    "sample": SamplingParams(max_new_tokens=24, seed=5),
    "top_p": SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.8, seed=6),
    "stop_tokens": SamplingParams(max_new_tokens=24, seed=7, stop_token_ids=(40, 41, 42, 43)),
    "stop_strings": SamplingParams(max_new_tokens=24, seed=8, stop_strings=("a", "7", "Q")),
}


def _pair(model, tok, batch_ref: int = 3, batch_engine: int = 5, hidden: str = "float32"):
    """Both backends over the same weights, batching differently (rows must not interact)."""
    return (CPUEngine(model, tok, EngineConfig(max_batch_size=batch_engine, hidden_dtype=hidden)),
            ReferenceBackend(model, tok, ReferenceConfig(max_batch_size=batch_ref)))


def _same(a, b, hidden_atol: float | None = None) -> None:
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [(c.finish_reason, c.seq_id, c.prompt_ids) for c in a] == [
        (c.finish_reason, c.seq_id, c.prompt_ids) for c in b]
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
        if hidden_atol is not None:
            assert torch.allclose(x.hidden_states.float(), y.hidden_states, atol=hidden_atol)


@pytest.mark.parametrize("case", sorted(CASES))
def test_generate_agrees_with_the_engine(qwen, tok, random_prompts, case) -> None:
    engine, ref = _pair(qwen, tok)
    prompts, seq_ids = random_prompts(9, 2, 14, seed=1), [3, 1, 4, 1, 5, 9, 2, 6, 5]
    params = CASES[case].model_copy(update={"return_hidden_states": True})
    a, b = engine.generate(prompts, params, seq_ids), ref.generate(prompts, params, seq_ids)
    _same(a, b, hidden_atol=1e-4)
    assert ("stop" in {c.finish_reason for c in a}) == case.startswith("stop")


def test_eos_and_ignore_eos_agree(qwen, random_prompts) -> None:
    """With a frequent token as EOS (from the model config: no tokenizer), completions end on it,
    and `ignore_eos` runs them to the limit in both backends."""
    prompts = random_prompts(8, 3, 10, seed=2)
    plain = ReferenceBackend(qwen).generate(prompts, CASES["sample"])
    counts = torch.bincount(torch.tensor([t for c in plain for t in c.token_ids[:-1]]))
    model = copy.deepcopy(qwen)
    model.config.eos_token_id = int(counts.argmax())
    engine, ref = _pair(model, None)
    a, b = engine.generate(prompts, CASES["sample"]), ref.generate(prompts, CASES["sample"])
    _same(a, b)
    assert "eos" in {c.finish_reason for c in a} and all(
        c.token_ids[-1] == model.config.eos_token_id for c in a if c.finish_reason == "eos")
    keep = CASES["sample"].model_copy(update={"ignore_eos": True})
    a, b = engine.generate(prompts, keep), ref.generate(prompts, keep)
    _same(a, b)
    assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for c in a)


def test_context_limit_ends_completions_alike(tok, random_prompts) -> None:
    model = build_model("qwen2-tiny", tok.vocab_size, seed=3, max_position_embeddings=20)
    engine, ref = _pair(model, tok)
    prompts = random_prompts(4, 12, 18, seed=3)
    params = CASES["sample"].model_copy(update={"ignore_eos": True})
    a, b = engine.generate(prompts, params), ref.generate(prompts, params)
    _same(a, b)
    assert [len(c.token_ids) for c in a] == [20 - len(p) for p in prompts]


def test_score_agrees_with_the_engine_and_with_generate(qwen, tok, random_prompts) -> None:
    engine, ref = _pair(qwen, tok)
    prompts = random_prompts(6, 2, 12, seed=4)
    gen = ref.generate(prompts, CASES["sample"].model_copy(update={"return_hidden_states": True}))
    comps = [c.token_ids for c in gen]
    left = ReferenceBackend(qwen, tok, ReferenceConfig(max_batch_size=4, score_padding="left",
                                                       score_pad_to=40))
    e = engine.score(prompts, comps, return_logits=True)
    for r in (ref.score(prompts, comps, return_logits=True),
              left.score(prompts, comps, return_logits=True)):
        for x, y, g in zip(e, r, gen, strict=True):
            assert torch.allclose(x.logprobs, y.logprobs, atol=1e-4)
            assert torch.allclose(x.logits, y.logits, atol=1e-4)
            assert torch.allclose(x.hidden_states.float(), y.hidden_states, atol=1e-2)
            assert torch.allclose(y.hidden_states, g.hidden_states, atol=1e-4)
            assert torch.allclose(y.logprobs, torch.tensor(g.logprobs), atol=1e-4)
    scaled = ref.score(prompts, comps, temperature=0.5, return_hidden_states=False)
    assert scaled[0].hidden_states is None and scaled[0].logits is None
    assert torch.allclose(scaled[0].logprobs, engine.score(prompts, comps, 0.5)[0].logprobs,
                          atol=1e-4)
    assert ref.score([[5, 6]], [[]])[0].logprobs.shape == (0,)


@pytest.mark.parametrize("call, match", [
    (lambda b: b.generate([[]], SamplingParams()), "prompt 0 is empty"),
    (lambda b: b.generate([[5] * 600], SamplingParams()), "the context holds"),
    (lambda b: b.generate([[5, 999]], SamplingParams()), "outside the vocabulary"),
    (lambda b: b.generate([[5]], SamplingParams(), seq_ids=[1, 2]), "2 seq_ids for 1 prompts"),
    (lambda b: b.generate([[5]], SamplingParams(stop_strings=("",))), "empty string"),
    (lambda b: b.score([[5]], [[6], [7]]), "2 completions for 1 prompts"),
    (lambda b: b.score([[5]], [[6]], temperature=-1), "temperature must be >= 0"),
])
def test_bad_requests_are_refused_alike(qwen, tok, call, match) -> None:
    for backend in _pair(qwen, tok):
        with pytest.raises(InvalidRequestError, match=match):
            call(backend)
    with pytest.raises(InvalidRequestError, match="stop_strings need a tokenizer"):
        ReferenceBackend(qwen).generate([[5]], SamplingParams(stop_strings=("x",)))


def test_load_weights_stamps_versions_and_refuses_bad_weights(tok, tmp_path,
                                                              random_prompts) -> None:
    m1, m2 = (build_model("qwen2-tiny", tok.vocab_size, seed=s) for s in (1, 2))
    ref, prompts = ReferenceBackend(copy.deepcopy(m1), tok), random_prompts(3, 3, 8, seed=5)
    greedy = CASES["greedy"]
    before = ref.generate(prompts, greedy)
    assert {c.policy_version for c in before} == {0}
    ref.load_weights(m2.state_dict(), 4)
    after = ref.generate(prompts, greedy)
    assert {c.policy_version for c in after} == {4}
    assert [c.token_ids for c in after] == [c.token_ids for c in
                                            CPUEngine(m2, tok).generate(prompts, greedy)]
    save_model(m1, tok, tmp_path / "m1")
    ref.load_weights(tmp_path / "m1", 5)
    assert [c.token_ids for c in ref.generate(prompts, greedy)] == [c.token_ids for c in before]
    state = m2.state_dict()
    bad = [
        ({**state, "model.extra.weight": torch.zeros(3)}, "unexpected"),
        ({k: v for k, v in state.items() if k != "model.norm.weight"}, "missing"),
        (build_model("qwen2-4l-256", tok.vocab_size).state_dict(), "wrong shape"),
        ({**state, "lm_head.weight": state["model.embed_tokens.weight"] + 1}, "tied"),
        (tmp_path / "nowhere", "no model directory"),
    ]
    for weights, match in bad:
        with pytest.raises(WeightLoadError, match=match):
            ref.load_weights(weights, 6)
    kept = ref.generate(prompts, greedy)  # every refusal kept version 5's weights
    assert [c.token_ids for c in kept] == [c.token_ids for c in before]
    assert {c.policy_version for c in kept} == {5}


def test_the_contract_is_three_methods() -> None:
    assert InferenceBackend.__abstractmethods__ == {"generate", "score", "load_weights"}
    public = {n for n in vars(InferenceBackend) if not n.startswith("_")}
    assert public == {"generate", "score", "load_weights"}
    for cls in (CPUEngine, ReferenceBackend):
        assert issubclass(cls, InferenceBackend) and not cls.__abstractmethods__
