"""The weight perturbations the detection tests cheat with, and the reference worker: its
decode matches a prefill, its hidden states are post-norm, and the validator's replay
(`meshrl.validator.replay`, the checks a pool runs) accepts its rows and names each forgery."""

import dataclasses

import torch
from toploc_scenario import to_rows

from meshrl.inference import ReferenceBackend, ReferenceConfig, SamplingParams
from meshrl.model import CharTokenizer, build_model
from meshrl.pool import Check
from meshrl.toploc.perturb import noise_weights, quantize_tensor, quantize_weights, scale_layer_mlp
from meshrl.validator.replay import ReplayConfig, ReplaySpec, replay_file
from meshrl.wire.rollout_file import Completion as Row


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
        assert lg.shape == (12, tok.vocab_size)
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


def test_replay_accepts_the_reference_worker_and_names_each_forgery():
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=0)
    backend = ReferenceBackend(model, tok, ReferenceConfig(max_batch_size=2))
    params = SamplingParams(max_new_tokens=20, seed=7, temperature=0.8, ignore_eos=True,
                            return_hidden_states=True)
    gens = backend.generate([[5, 6, 7, 8], [9, 10, 11]], params, seq_ids=[3, 4])
    rows = to_rows(gens)  # the file rows a worker writes of them
    spec = ReplaySpec(seed=7, max_new_tokens=20, temperature=0.8, top_p=1.0, eos_token_ids=())
    cfg = ReplayConfig()
    findings, stats = replay_file(backend, rows, spec, cfg)
    assert findings == [] and stats.rows == 2 and stats.tokens == 40 and stats.chunks == 2
    assert stats.max_sampling_margin <= cfg.sampling_tolerance

    def checks(rows=rows, spec=spec) -> list[Check]:
        return [f.check for f in replay_file(backend, rows, spec, cfg)[0]]

    def first(**change) -> list[Row]:
        return [dataclasses.replace(rows[0], **change), rows[1]]

    assert checks(spec=dataclasses.replace(spec, seed=8)) == [Check.SAMPLING]  # another seed
    assert checks(first(seq_id=5)) == [Check.SAMPLING]  # another sequence's noise
    swapped = list(rows[0].completion_tokens)
    swapped[11] = (swapped[11] + 1) % tok.vocab_size
    [f] = replay_file(backend, first(completion_tokens=swapped), spec, cfg)[0][:1]
    assert f.check is Check.SAMPLING and "row 0 at position 11" in f.reason
    assert checks(first(logprobs=[x + 0.2 for x in rows[0].logprobs])) == [Check.LOGPROBS]
    assert checks(first(logprobs=[float("nan")] * 20)) == [Check.LOGPROBS]
    assert checks(first(logprobs=rows[0].logprobs[:-1])) == [Check.LOGPROBS]
    assert checks(first(finish_reason="eos")) == [Check.TERMINATION]
    # another row's proofs
    assert checks(first(toploc_proofs=rows[1].toploc_proofs)) == [Check.TOPLOC]
