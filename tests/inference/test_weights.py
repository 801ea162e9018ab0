import pytest
import torch

from meshrl.inference import CPUEngine, SamplingParams, WeightLoadError
from meshrl.inference.transformer import KVCache, ModelSpec, PackedWeights, decode_step, forward
from meshrl.model import build_model, save_model

GREEDY = SamplingParams(max_new_tokens=12, temperature=0)


@pytest.mark.parametrize("preset", ["qwen2-tiny", "llama-tiny"])
def test_forward_and_decode_match_hf_logits(preset, tok, random_prompts) -> None:
    model = build_model(preset, tok.vocab_size, seed=9)
    spec = ModelSpec.from_hf_config(model.config)
    w = PackedWeights.pack(spec, model.state_dict())
    ids = torch.tensor(random_prompts(3, 11, 11, seed=6))
    with torch.inference_mode():
        ref = model(ids, output_hidden_states=True)
        pos = torch.arange(10).expand(3, 10)
        allowed = torch.ones(10, 10, dtype=torch.bool).tril()[None, None].expand(3, 1, 10, 10)
        cache = KVCache(spec, 3, 11)
        hid = forward(w, ids[:, :10], pos, allowed, cache)
        assert torch.allclose(hid, ref.hidden_states[-1][:, :10], atol=1e-5)
        assert torch.allclose(hid @ w.lm_head, ref.logits[:, :10], atol=1e-5)
        bias = torch.zeros(3 * spec.kv_heads, 1, 11)
        last = decode_step(w, ids[:, 10], torch.full((3,), 10), cache, 10, bias)
        assert torch.allclose(last @ w.lm_head, ref.logits[:, 10], atol=1e-5)


def test_hot_reload_from_state_dict_and_directory(tok, tmp_path, random_prompts) -> None:
    m1 = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    m2 = build_model("qwen2-tiny", tok.vocab_size, seed=2)
    prompts = random_prompts(4, 3, 9, seed=7)
    want = [o.token_ids for o in CPUEngine(m2, tok).generate(prompts, GREEDY)]
    engine = CPUEngine(m1, tok)
    before = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    assert before != want
    assert {o.policy_version for o in engine.generate(prompts, GREEDY)} == {0}
    engine.load_weights(m2.state_dict(), 1)
    after = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in after] == want and {o.policy_version for o in after} == {1}
    save_model(m1, tok, tmp_path / "m1")
    engine.load_weights(tmp_path / "m1", 2)
    again = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in again] == before and {o.policy_version for o in again} == {2}
    fresh = CPUEngine.from_pretrained(tmp_path / "m1")
    assert [o.token_ids for o in fresh.generate(prompts, GREEDY)] == before


def test_bad_checkpoints_are_refused_and_keep_the_old_weights(
    engine, tok, tmp_path, random_prompts
) -> None:
    prompts = random_prompts(2, 3, 6, seed=8)
    before = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    big = build_model("qwen2-4l-256", tok.vocab_size, seed=0)
    with pytest.raises(WeightLoadError, match="shape"):
        engine.load_weights(big.state_dict(), 1)
    save_model(big, tok, tmp_path / "big")
    with pytest.raises(WeightLoadError, match="architecture"):
        engine.load_weights(tmp_path / "big", 1)
    state = dict(engine_state(tok))
    del state["model.norm.weight"]
    with pytest.raises(WeightLoadError, match=r"missing model\.norm\.weight"):
        engine.load_weights(state, 1)
    state = dict(engine_state(tok))
    del state["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(WeightLoadError, match=r"missing model\.layers\.1\.self_attn\.k_proj\.bias"):
        engine.load_weights(state, 1)
    state = {**engine_state(tok)}
    state["lm_head.weight"] = state["model.embed_tokens.weight"] + 1.0
    with pytest.raises(WeightLoadError, match="tied"):
        engine.load_weights(state, 1)
    with pytest.raises(WeightLoadError, match="unexpected"):
        engine.load_weights({**engine_state(tok), "model.extra.weight": torch.zeros(3)}, 1)
    with pytest.raises(WeightLoadError, match="not a directory"):
        engine.load_weights(tmp_path / "nowhere", 1)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(WeightLoadError, match="unreadable"):
        engine.load_weights(broken, 1)
    kept = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in kept] == before
    assert {o.policy_version for o in kept} == {0}  # a refused load does not bump the version


def engine_state(tok) -> dict[str, torch.Tensor]:
    return build_model("qwen2-tiny", tok.vocab_size, seed=4).state_dict()
