"""Bring your own model: hub-layout directories of Qwen2.5, Qwen3 and Llama 3 (tied and untied,
GQA and MQA, q / k norms, llama3 RoPE scaling, sharded safetensors) through the fast engine,
token for token against the reference backend, and through TOPLOC with honest acceptance."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from hf_families import FAMILY_CONFIGS, save_family
from meshrl.inference import (
    CPUEngine,
    EngineConfig,
    EngineUnsupportedError,
    ReferenceBackend,
    SamplingParams,
    engine_or_reference,
    engine_refusal,
)
from meshrl.inference.transformer import ModelSpec, rope_inv_freq
from meshrl.model import UnsupportedModelError, load_model, load_tokenizer
from meshrl.pool import decide
from meshrl.toploc import build_proofs
from meshrl.validator.replay import ReplayConfig, ReplaySpec, replay_files
from meshrl.wire.rollout_file import Completion as Row

FAMILIES = sorted(FAMILY_CONFIGS)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: save_family(name, root / name, seed=i) for i, name in enumerate(FAMILIES)}


def _prompts(tok, n: int, seed: int) -> list[list[int]]:
    """Prompts of ordinary tokens (no stop token), 3 to 14 long."""
    g = torch.Generator().manual_seed(seed)
    ordinary = [t for t in range(tok.vocab_size) if t not in tok.eos_token_ids
                and t != tok.pad_token_id]
    return [[ordinary[int(i)] for i in torch.randint(len(ordinary), (int(k),), generator=g)]
            for k in torch.randint(3, 15, (n,), generator=g)]


def test_hub_layout_is_what_gets_loaded(dirs) -> None:
    d = dirs["llama3.1-untied"]
    assert len(list(d.glob("model-*-of-*.safetensors"))) >= 2
    assert (d / "model.safetensors.index.json").is_file()
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    model = load_model(d)
    assert model.config.rope_parameters["rope_type"] == "llama3"
    assert not model.config.tie_word_embeddings
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_equals_reference_token_for_token(dirs, name) -> None:
    model, tok = load_model(dirs[name]), load_tokenizer(dirs[name])
    assert engine_refusal(model.config) is None
    ref = ReferenceBackend(model, tok)
    prompts = _prompts(tok, 6, seed=1)
    for params in (SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True),
                   SamplingParams(max_new_tokens=20, temperature=1.0, seed=9)):
        want = ref.generate(prompts, params)
        for kernels in ("torch", "auto"):
            engine = CPUEngine(model, tok, EngineConfig(decode_kernels=kernels))
            got = engine.generate(prompts, params)
            for g, w in zip(got, want, strict=True):
                assert g.token_ids == w.token_ids, (name, kernels, params.temperature)
                assert g.finish_reason == w.finish_reason
                assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs,
                                                      strict=True)) < 1e-3


def test_engine_rope_frequencies_are_hfs(dirs) -> None:
    """Llama 3's scaled frequencies (all three bands exercised) equal HF's rotary embedding."""
    model = load_model(dirs["llama3.1-untied"])
    spec = ModelSpec.from_hf_config(model.config)
    ours, hf = rope_inv_freq(spec), model.model.rotary_emb.inv_freq
    assert torch.equal(ours, hf)
    plain = rope_inv_freq(ModelSpec(**{**asdict(spec), "rope_llama3": None}))
    assert (ours == plain).any() and (ours < plain).any()  # kept, scaled and smoothed bands
    assert ((ours < plain) & (ours > plain / 8)).any()


@pytest.mark.parametrize("name", FAMILIES)
def test_toploc_honest_work_is_accepted(dirs, name) -> None:
    """A worker's engine rollouts, proofs from its bf16 hidden states, replayed by a validator
    on the reference backend (one prefill) and on the engine: accepted."""
    model, tok = load_model(dirs[name]), load_tokenizer(dirs[name])
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=5, return_hidden_states=True)
    prompts = _prompts(tok, 4, seed=2)
    gens = CPUEngine(model, tok).generate(prompts, params)
    rows = [Row(prompt_id="", counter=0, sample_index=0, seq_id=c.seq_id,
                prompt_tokens=c.prompt_ids, completion_tokens=c.token_ids, logprobs=c.logprobs,
                reward=0.0, finish_reason=c.finish_reason,
                toploc_proofs=build_proofs(c.hidden_states)) for c in gens]
    spec = ReplaySpec(seed=5, max_new_tokens=40, temperature=1.0, top_p=1.0,
                      eos_token_ids=tok.eos_token_ids)
    for validator in (ReferenceBackend(model, tok), CPUEngine(model, tok)):
        [(findings, stats)] = replay_files(validator, [(rows, spec)], ReplayConfig())
        decision = decide(findings, asdict(stats))
        assert decision.accepted, (name, type(validator).__name__, decision.reason)


def test_stop_tokens_of_generation_config_all_end_completions(dirs) -> None:
    tok = load_tokenizer(dirs["qwen3-tied"])
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert tok.eos_token_ids == (im_end, eot)
    model = load_model(dirs["qwen3-tied"])
    # bias the head so that sampling hits the second stop token often
    with torch.no_grad():
        model.lm_head.weight[eot] *= 0
        model.lm_head.weight[eot] += model.model.norm.weight.sign() * 0.2
    prompts = _prompts(tok, 8, seed=3)
    params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=1)
    for backend in (CPUEngine(model, tok), ReferenceBackend(model, tok)):
        outs = backend.generate(prompts, params)
        ends = {o.token_ids[-1] for o in outs if o.finish_reason == "eos"}
        assert eot in ends, type(backend).__name__
        for o in outs:
            assert not set(o.token_ids[:-1]) & {im_end, eot}


def _config(name: str, **changes):
    from transformers import AutoConfig

    data = {**FAMILY_CONFIGS[name], **changes}
    return AutoConfig.for_model(data.pop("model_type"), vocab_size=300, **data)


@pytest.mark.parametrize("name, changes, match", [
    ("llama3.1-untied", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 8192}},
     "unsupported RoPE type 'yarn'"),
    ("qwen3-tied", {"attention_bias": True}, "o_proj biases"),
    ("llama3.1-untied", {"mlp_bias": True}, "MLP / o_proj biases"),
    ("qwen2.5-tied", {"use_sliding_window": True}, "sliding-window"),
    ("llama3.2-tied", {"hidden_act": "gelu"}, "unsupported activation 'gelu'"),
])
def test_engine_refuses_what_it_cannot_run_and_the_reference_takes_it(name, changes,
                                                                      match) -> None:
    from transformers import AutoModelForCausalLM

    cfg = _config(name, **changes)
    with pytest.raises(EngineUnsupportedError, match=match):
        ModelSpec.from_hf_config(cfg)
    refusal = engine_refusal(cfg)
    assert isinstance(refusal, EngineUnsupportedError) and "\n" not in str(refusal)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    backend = engine_or_reference(model, None, version=3)
    assert isinstance(backend, ReferenceBackend)
    out = backend.generate([[5, 6, 7]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4 and out[0].policy_version == 3


def test_engine_or_reference_takes_the_engine_when_it_can(dirs) -> None:
    model, tok = load_model(dirs["qwen3-tied"]), load_tokenizer(dirs["qwen3-tied"])
    backend = engine_or_reference(model, tok, version=2)
    assert isinstance(backend, CPUEngine)
    assert backend.generate([[5, 6]], SamplingParams(max_new_tokens=2))[0].policy_version == 2


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
     "unsupported architecture model_type 'mamba'"),
    ({"architectures": ["Qwen3ForSequenceClassification"]},
     "unsupported architectures entry 'Qwen3ForSequenceClassification'"),
    ({"model_type": None}, "unsupported architecture model_type None"),
])
def test_unsupported_model_directory_is_one_line_error(dirs, tmp_path, changes, match) -> None:
    import shutil

    d = tmp_path / "m"
    shutil.copytree(dirs["qwen3-tied"], d)
    cfg = {**json.loads((d / "config.json").read_text()), **changes}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=match) as e:
        load_model(d)
    assert "\n" not in str(e.value) and "config.json" in str(e.value)
