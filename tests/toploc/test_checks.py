"""Sampling, termination, log-prob and reward checks; perturbations; the HF reference worker."""

import pytest
import torch

from meshrl.inference import ReferenceBackend, ReferenceConfig, SamplingParams
from meshrl.inference.sampling import sample_tokens
from meshrl.model import CharTokenizer, build_model
from meshrl.toploc import (
    check_logprobs,
    check_rewards,
    check_sampling,
    check_termination,
    recompute_logprobs,
)
from meshrl.toploc.perturb import noise_weights, quantize_tensor, quantize_weights, scale_layer_mlp

EOS = 2


def test_termination():
    assert check_termination([5, 6, EOS], "eos", 8, [EOS]).ok
    assert check_termination([5, 6, 7], "length", 3, [EOS]).ok
    assert check_termination([5, 9], "stop", 8, [EOS], [9]).ok
    truncated = check_termination([5, 6], "length", 3, [EOS])
    assert not truncated.ok and "length" in truncated.reason
    assert not check_termination([5, 6], "eos", 3, [EOS]).ok
    assert not check_termination([5, EOS, 6], "length", 3, [EOS]).ok
    assert not check_termination([5, 6, 7, 8], "length", 3, [EOS]).ok
    assert not check_termination([5, 6, EOS], "length", 3, [EOS]).ok
    assert not check_termination([5], "abort", 3, [EOS]).ok
    assert not check_termination([], "eos", 3, [EOS]).ok


def test_sampling_replay():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 50, generator=g) * 3
    tokens = sample_tokens(logits, 7, [3] * 20, list(range(20)), temperature=0.8)
    assert check_sampling(logits, tokens, 7, 3, temperature=0.8).ok
    assert not check_sampling(logits, tokens, 8, 3, temperature=0.8).ok  # other seed
    assert not check_sampling(logits, tokens, 7, 4, temperature=0.8).ok  # other sequence
    bad = tokens.clone()
    bad[11] = (bad[11] + 1) % 50
    res = check_sampling(logits, bad, 7, 3, temperature=0.8)
    assert not res.ok and "position 11" in res.reason
    assert not check_sampling(logits, tokens[:-1], 7, 3).ok
    assert not check_sampling(logits, torch.full((20,), 99), 7, 3).ok
    assert not check_sampling(logits * float("nan"), tokens, 7, 3).ok


def test_logprobs_and_rewards():
    logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(1))
    tokens = [1, 2, 3, 4, 5, 6]
    lp = recompute_logprobs(logits, tokens)
    assert lp[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
    assert check_logprobs(lp.tolist(), logits, tokens).ok
    assert not check_logprobs((lp + 0.2).tolist(), logits, tokens).ok
    assert not check_logprobs(lp[:-1].tolist(), logits, tokens).ok
    assert not check_logprobs([float("nan")] * 6, logits, tokens).ok
    assert check_rewards([1.0, 0.0], [1.0, 0.0]).ok
    assert not check_rewards([1.0, 1.0], [1.0, 0.0]).ok
    assert not check_rewards([1.0], [1.0, 0.0]).ok
    assert not check_rewards([float("nan")], [0.0]).ok


def test_quantize_tensor_hand_checked():
    w = torch.tensor([[1.0, -0.3, 0.26, 0.0]])
    # 4 bits: qmax 7, scale 1/7: -0.3 * 7 = -2.1 -> -2, 0.26 * 7 = 1.82 -> 2
    assert torch.allclose(quantize_tensor(w, 4), torch.tensor([[1.0, -2 / 7, 2 / 7, 0.0]]))
    assert torch.equal(quantize_tensor(torch.zeros(2, 3), 8), torch.zeros(2, 3))


def test_perturbations_copy_and_change():
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for changed in (scale_layer_mlp(model, 1.5), noise_weights(model, 0.01), quantize_weights(
            model, 4)):
        diff = [k for k, v in changed.state_dict().items() if not torch.equal(v, before[k])]
        assert diff
    scaled = scale_layer_mlp(model, 2.0, layer=1).model.layers[1].mlp.down_proj.weight
    assert torch.allclose(scaled, 2 * before["model.layers.1.mlp.down_proj.weight"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_reference_worker_matches_prefill_and_uses_post_norm_states():
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=0)  # fp32: decode ~= prefill
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    backend = ReferenceBackend(model, tok, ReferenceConfig(max_batch_size=2, score_padding="left"))
    params = SamplingParams(max_new_tokens=12, seed=3, ignore_eos=True, return_hidden_states=True)
    gens = backend.generate(prompts, params)
    rec = backend.score(prompts, [g.token_ids for g in gens], return_logits=True)
    for g, r in zip(gens, rec, strict=True):
        h, lg = r.hidden_states, r.logits
        assert len(g.token_ids) == 12 == h.shape[0] and g.finish_reason == "length"
        assert torch.allclose(g.hidden_states, h, atol=1e-4)
        assert check_sampling(lg, g.token_ids, 3, g.seq_id).ok
        assert check_logprobs(g.logprobs, lg, g.token_ids).ok
    ids = torch.tensor([prompts[0] + gens[0].token_ids])
    raw = []
    hook = model.model.layers[-1].register_forward_hook(lambda m, i, o: raw.append(o))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    hook.remove()
    last = raw[0][0] if isinstance(raw[0], tuple) else raw[0]
    assert torch.allclose(out.hidden_states[-1], model.model.norm(last), atol=1e-5)  # post-norm
    assert not torch.allclose(out.hidden_states[-1], last, atol=1e-2)
    assert torch.allclose(out.hidden_states[-1][0, 3:-1], rec[0].hidden_states, atol=1e-4)
