import pytest
import torch
from pydantic import ValidationError

import meshrl.inference as inf
from meshrl.inference import (
    CPUEngine,
    EngineConfig,
    InvalidRequestError,
    SamplingParams,
    check_sampled_tokens,
)
from meshrl.model import build_model


def hf_greedy(model, prompts, n, tok) -> list[list[int]]:
    """`transformers` generate, greedy, on a left-padded batch; tokens after EOS dropped."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    rows = out[:, width:].tolist()
    return [r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in rows]


@pytest.mark.parametrize("preset", ["qwen2-tiny", "llama-tiny"])
def test_greedy_equals_hf_generate(preset, tok, random_prompts) -> None:
    model = build_model(preset, tok.vocab_size, seed=5)
    engine = CPUEngine(model, tok)
    prompts = random_prompts(6, 1, 20, seed=1)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0))
    for p, o, ref in zip(prompts, outs, hf_greedy(model, prompts, 24, tok), strict=True):
        assert o.prompt_ids == p
        assert o.token_ids == ref
        assert len(o.logprobs) == len(o.token_ids)
        assert o.finish_reason == ("eos" if o.token_ids[-1] == tok.eos_token_id else "length")


def test_sampling_logprobs_hidden_and_tokens_agree_with_prefill(
    engine, qwen, random_prompts
) -> None:
    prompts = random_prompts(8, 2, 15, seed=2)
    params = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=77,
                            return_hidden_states=True)
    seq_ids = [100 + i for i in range(8)]
    outs = engine.generate(prompts, params, seq_ids=seq_ids)
    scores = engine.score(prompts, outs, temperature=0.8, return_logits=True)
    for p, o, s in zip(prompts, outs, scores, strict=True):
        n = len(o.token_ids)
        assert o.hidden_states.shape == (n, 128) and o.hidden_states.dtype == torch.bfloat16
        assert torch.allclose(torch.tensor(o.logprobs), s.logprobs, atol=1e-4)
        assert torch.allclose(o.hidden_states.float(), s.hidden_states.float(), atol=0.02,
                              rtol=0.02)
        # a validator's replay: recomputed logits accept every sampled token
        ok = check_sampled_tokens(s.logits, o.token_ids, 77, [o.seq_id] * n, range(n), 0.8, 0.9)
        assert ok.all()
        # scoring logits are the HF model's logits at the predicting positions
        with torch.inference_mode():
            ref = qwen(torch.tensor([p + o.token_ids])).logits[0, len(p) - 1 : -1]
        assert torch.allclose(s.logits, ref, atol=1e-4)


def test_sampling_depends_only_on_seed_seq_id_position(engine, qwen, tok, random_prompts) -> None:
    prompts = random_prompts(6, 3, 12, seed=3)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=5)
    batch = engine.generate(prompts, params, seq_ids=[10, 11, 12, 13, 14, 15])
    alone = engine.generate(prompts[2:3], params, seq_ids=[12])[0]
    assert alone.token_ids == batch[2].token_ids
    again = engine.generate(prompts[2:3], params.model_copy(update={"seed": 6}), seq_ids=[12])
    assert again[0].token_ids != alone.token_ids
    chunked = CPUEngine(qwen, tok, EngineConfig(max_batch_size=4))
    assert [o.token_ids for o in chunked.generate(prompts, params, [10, 11, 12, 13, 14, 15])] \
        == [o.token_ids for o in batch]


def test_eos_stops_and_finished_rows_leave_the_batch(qwen, tok, random_prompts) -> None:
    # a hot temperature over 99 tokens draws EOS often, so many rows finish early
    prompts = random_prompts(24, 1, 10, seed=4)
    params = SamplingParams(max_new_tokens=60, temperature=5.0, seed=1)
    compacting = CPUEngine(qwen, tok, EngineConfig(compact_below=1.0)).generate(prompts, params)
    masked = CPUEngine(qwen, tok, EngineConfig(compact_below=0.0)).generate(prompts, params)
    reasons = [o.finish_reason for o in compacting]
    assert 3 <= reasons.count("eos") <= 21 and "length" in reasons
    for a, b in zip(compacting, masked, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        eos_at = [i for i, t in enumerate(a.token_ids) if t == tok.eos_token_id]
        if a.finish_reason == "eos":
            assert eos_at == [len(a.token_ids) - 1]
        else:
            assert eos_at == [] and len(a.token_ids) == 60


def test_stop_tokens_and_strings(engine, tok, random_prompts) -> None:
    prompts = random_prompts(3, 4, 8, seed=5)
    base = engine.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0))
    stop_tok = base[0].token_ids[6]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0,
                                                  stop_token_ids=(stop_tok,)))
    first = base[0].token_ids.index(stop_tok)
    assert out[0].token_ids == base[0].token_ids[: first + 1] and out[0].finish_reason == "stop"
    text = tok.decode(base[1].token_ids)
    needle = text[10:13]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0,
                                                  stop_strings=(needle,)))[1]
    got = tok.decode(out.token_ids)
    assert out.finish_reason == "stop" and got.endswith(needle) and got.count(needle) == 1
    assert out.token_ids == base[1].token_ids[: len(out.token_ids)]


def test_context_limit_truncates_generation(qwen, tok) -> None:
    engine = CPUEngine(qwen, tok, EngineConfig(max_seq_len=20))
    outs = engine.generate([[5] * 15, [6] * 3], SamplingParams(max_new_tokens=10, temperature=0))
    assert len(outs[0].token_ids) == 5 and outs[0].finish_reason == "length"
    assert len(outs[1].token_ids) == 10


@pytest.mark.parametrize(("prompts", "kwargs", "match"), [
    ([[]], {}, "empty"),
    ([[5] * 256], {}, "context"),
    ([[5, 999]], {}, "outside the vocabulary"),
    ([[5, -1]], {}, "outside the vocabulary"),
    ([[5]], {"stop_token_ids": (99,)}, "stop_token_ids"),
    ([[5]], {"stop_strings": ("",)}, "empty string"),
    ([[5, 2.5]], {}, "integers"),
    (["abc"], {}, "integers"),
])
def test_bad_requests_are_clear_errors(engine, prompts, kwargs, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        engine.generate(prompts, SamplingParams(max_new_tokens=4, **kwargs))


def test_bad_params_and_score_requests(engine) -> None:
    with pytest.raises(ValidationError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValidationError):
        SamplingParams(top_p=0.0)
    with pytest.raises(InvalidRequestError, match="seq_ids"):
        engine.generate([[5], [6]], SamplingParams(), seq_ids=[1])
    with pytest.raises(InvalidRequestError, match="context"):
        engine.score([[5] * 200], [[6] * 100])
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.score([[]], [[6]])
    assert engine.generate([], SamplingParams()) == []
    # tensors / numpy integers are accepted and come back as Python ints
    out = engine.generate([torch.tensor([5, 6, 7])], SamplingParams(max_new_tokens=2),
                          seq_ids=torch.tensor([3]))[0]
    assert out.prompt_ids == [5, 6, 7] and type(out.prompt_ids[0]) is int and out.seq_id == 3
    empty = engine.score([[5, 6]], [[]])[0]
    assert empty.logprobs.shape == (0,) and empty.hidden_states.shape == (0, 128)


def test_public_api() -> None:
    assert set(inf.__all__) >= {"CPUEngine", "EngineConfig", "SamplingParams", "Completion",
                                "ScoreResult", "InferenceBackend"}
    assert all(hasattr(inf, name) for name in inf.__all__)
    assert issubclass(CPUEngine, inf.InferenceBackend)


def test_cli_generate_prints_replayable_completions(qwen, tok, tmp_path, capsys) -> None:
    import json

    from meshrl.cli import main
    from meshrl.model import save_model

    save_model(qwen, tok, tmp_path / "m")
    argv = ["inference", "generate", "--model", str(tmp_path / "m"), "--prompts", '["12+3=", "ab"]',
            "--n", "2", "--sampling.max_new_tokens", "6", "--sampling.seed", "4"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq_id"] for r in rows] == [0, 1, 2, 3]
    assert [r["prompt"] for r in rows] == ["12+3=", "12+3=", "ab", "ab"]
    engine = CPUEngine(qwen, tok)
    again = engine.generate([tok.encode("ab")], SamplingParams(max_new_tokens=6, seed=4), [3])[0]
    assert rows[3]["token_ids"] == again.token_ids
    assert main(["inference", "generate", "--model", str(tmp_path / "m")]) == 2


def test_prefill_on_real_tokens_equals_the_padded_grid(qwen, random_prompts) -> None:
    from meshrl.inference.engine import _left_pad, _real_slots
    from meshrl.inference.transformer import KVCache, ModelSpec, PackedWeights, forward

    spec = ModelSpec.from_hf_config(qwen.config)
    w = PackedWeights.pack(spec, qwen.state_dict())
    ids, pos, allowed, pad = _left_pad(random_prompts(7, 1, 16, seed=5))
    b, width = ids.shape
    real = _real_slots(pad, width)
    assert real.numel() == int((width - pad).sum())
    grid_cache, real_cache = KVCache(spec, b, width), KVCache(spec, b, width)
    with torch.inference_mode():
        grid = forward(w, ids, pos, allowed, grid_cache).reshape(b * width, -1)
        only = forward(w, ids, pos, allowed, real_cache, real)
    assert only.shape == (real.numel(), spec.hidden)
    assert torch.allclose(only, grid[real], atol=1e-5)
    for r, first in enumerate(pad.tolist()):  # the cache agrees wherever decoding reads it
        assert torch.allclose(real_cache.k[:, r, :, first:], grid_cache.k[:, r, :, first:],
                              atol=1e-5)
        assert torch.allclose(real_cache.v[:, r, :, first:], grid_cache.v[:, r, :, first:],
                              atol=1e-5)


def test_grouped_batch_prefills_each_prompt_once(qwen, tok, random_prompts, monkeypatch) -> None:
    """A worker's batch (each prompt group_size times, here also out of order) prefills each
    distinct prompt once and gives the tokens, log-probs and hidden states of prefilling every
    row."""
    import meshrl.inference.engine as eng

    distinct = random_prompts(4, 3, 18, seed=9)
    prompts = [distinct[i] for i in (0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 1, 0)]
    prefilled: list[int] = []
    real_forward = eng.forward

    def counting_forward(w, ids, *args, **kwargs):
        prefilled.append(ids.shape[0])
        return real_forward(w, ids, *args, **kwargs)

    monkeypatch.setattr(eng, "forward", counting_forward)
    shared = CPUEngine(qwen, tok, EngineConfig())
    every = CPUEngine(qwen, tok, EngineConfig(share_prompts=False))
    for params in (SamplingParams(max_new_tokens=12, temperature=0, return_hidden_states=True),
                   SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.8, seed=3,
                                  return_hidden_states=True)):
        prefilled.clear()
        got = shared.generate(prompts, params)
        assert prefilled == [4]
        want = every.generate(prompts, params)
        assert prefilled == [4, len(prompts)]
        for a, b in zip(got, want, strict=True):
            assert a.prompt_ids == b.prompt_ids and a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
            assert torch.equal(a.hidden_states, b.hidden_states)
        if params.temperature > 0:  # a group's rows are different samples of one prompt
            assert len({tuple(got[i].token_ids) for i in range(3)}) > 1


def test_shared_prompt_prefix_is_prefilled_once(qwen, tok, random_prompts, monkeypatch) -> None:
    """Prompts that start alike (a chat template's system turn) prefill that prefix once, in one
    row, and the rest per row over it: the same completions as prefilling every row whole
    (log-probs and hidden states to float32 rounding: the attention sums run over other
    widths), grouped rows too."""
    import meshrl.inference.engine as eng

    head = random_prompts(1, 11, 11, seed=4)[0]
    tails = random_prompts(5, 1, 9, seed=8)
    prompts = [head + tails[i] for i in (0, 1, 1, 2, 3, 4, 4, 0)]
    sizes: list[tuple[int, int]] = []
    real_forward = eng.forward

    def counting_forward(w, ids, *args, **kwargs):
        sizes.append(tuple(ids.shape))
        return real_forward(w, ids, *args, **kwargs)

    monkeypatch.setattr(eng, "forward", counting_forward)
    shared = CPUEngine(qwen, tok, EngineConfig())
    every = CPUEngine(qwen, tok, EngineConfig(share_prompts=False))
    width = max(len(p) for p in prompts)
    for params in (SamplingParams(max_new_tokens=10, temperature=0, return_hidden_states=True),
                   SamplingParams(max_new_tokens=10, temperature=0.9, seed=5,
                                  return_hidden_states=True)):
        sizes.clear()
        got = shared.generate(prompts, params)
        assert sizes == [(1, len(head)), (5, width - len(head))]  # 5 distinct prompts
        want = every.generate(prompts, params)
        assert sizes[2:] == [(len(prompts), width)]
        for a, b in zip(got, want, strict=True):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
            assert torch.allclose(a.hidden_states.float(), b.hidden_states.float(), atol=0.02,
                                  rtol=0.02)
