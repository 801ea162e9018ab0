"""The native decode kernels against the torch decode step and HF, and the fallback without them."""

import pytest
import torch

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.inference import native as nat
from meshrl.inference.engine import _left_pad, _pad_bias
from meshrl.inference.transformer import KVCache, ModelSpec, PackedWeights, decode_step, forward
from meshrl.model import build_model


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def kernels(kernel_dir) -> nat.NativeKernels:
    return nat.NativeKernels.load(kernel_dir)


# head_dim 32 with GQA (the vectorised paths), and head_dim 12 without GQA (the scalar tails)
SHAPES = {
    "qwen2-tiny": {},
    "llama-tiny": {},
    "qwen2-hd12": {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 4},
}


def _step_both(model, kernels, prompts, steps: int, threads: int = 1):
    """Prefill, then `steps` decode steps on the torch and the native path from the same state."""
    spec = ModelSpec.from_hf_config(model.config)
    w = PackedWeights.pack(spec, model.state_dict())
    ids, pos, allowed, pad = _left_pad(prompts)
    b, width = ids.shape
    caches = [KVCache(spec, b, width + steps), KVCache(spec, b, width + steps)]
    ws = nat.NativeWorkspace.allocate(w, b)
    with torch.inference_mode():
        for c in caches:
            h = forward(w, ids, pos, allowed, c)[:, -1]
        bias = _pad_bias(pad, spec, caches[0])
        tok, p = (h @ w.lm_head).argmax(-1), pos[:, -1] + 1
        torch_h, native_h = [], []
        for j in range(steps):
            torch_h.append(decode_step(w, tok, p, caches[0], width + j, bias))
            native_h.append(nat.decode_step_native(kernels, w, tok, p, caches[1], width + j,
                                                   pad, ws, threads=threads))
            tok, p = (torch_h[-1] @ w.lm_head).argmax(-1), p + 1
    return w, torch.stack(torch_h), torch.stack(native_h), caches, pad


@pytest.mark.parametrize("shape", list(SHAPES))
def test_native_step_equals_torch_step(shape, tok, kernels, random_prompts) -> None:
    preset = "qwen2-tiny" if shape.startswith("qwen2") else "llama-tiny"
    model = build_model(preset, tok.vocab_size, seed=4, **SHAPES[shape])
    prompts = random_prompts(5, 1, 13, seed=8)  # left padding 0..12: rows attend different spans
    w, th, nh, (ct, cn), pad = _step_both(model, kernels, prompts, steps=11)
    assert torch.allclose(nh, th, atol=1e-5)
    assert torch.allclose(nh @ w.lm_head, th @ w.lm_head, atol=1e-5)
    for r, first in enumerate(pad.tolist()):  # the cache is written alike (padding is not used)
        assert torch.allclose(cn.k[:, r, :, first:], ct.k[:, r, :, first:], atol=1e-5)
        assert torch.allclose(cn.v[:, r, :, first:], ct.v[:, r, :, first:], atol=1e-5)


def test_threaded_attention_is_bit_identical(tok, kernels, random_prompts) -> None:
    model = build_model("qwen2-tiny", tok.vocab_size, seed=2)
    prompts = random_prompts(7, 1, 9, seed=3)
    _, _, one, *_ = _step_both(model, kernels, prompts, steps=2, threads=1)
    _, _, two, *_ = _step_both(model, kernels, prompts, steps=2, threads=3)
    assert torch.equal(one, two)


@pytest.mark.parametrize("preset", ["qwen2-tiny", "llama-tiny"])
def test_both_decode_paths_generate_alike(preset, tok, random_prompts) -> None:
    model = build_model(preset, tok.vocab_size, seed=6)
    prompts = random_prompts(10, 1, 12, seed=9)
    params = SamplingParams(max_new_tokens=30, temperature=3.0, seed=2)  # EOS often: compaction
    outs = {k: CPUEngine(model, tok, EngineConfig(decode_kernels=k)).generate(prompts, params)
            for k in ("native", "torch")}
    assert {o.finish_reason for o in outs["native"]} == {"eos", "length"}
    for a, b in zip(outs["native"], outs["torch"], strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_kernels_are_built_once_and_cached(kernels, kernel_dir, monkeypatch) -> None:
    assert nat.NativeKernels.load(kernel_dir) is kernels
    assert kernels.path.parent == kernel_dir and kernels.path.suffix == ".so"
    assert [p.name for p in kernel_dir.iterdir()] == [kernels.path.name]  # no temporaries left
    monkeypatch.delitem(nat._loaded, kernel_dir)
    monkeypatch.setattr(nat, "_compiler", lambda: pytest.fail("rebuilt a cached library"))
    assert nat.NativeKernels.load(kernel_dir).path == kernels.path


def test_without_a_compiler_auto_falls_back_and_native_is_an_error(
    qwen, tok, tmp_path, monkeypatch, random_prompts
) -> None:
    monkeypatch.setattr(nat.shutil, "which", lambda name: None)
    cache = str(tmp_path / "none")
    with pytest.raises(nat.NativeUnavailableError, match="compiler"):
        CPUEngine(qwen, tok, EngineConfig(decode_kernels="native", kernel_cache_dir=cache))
    fallback = CPUEngine(qwen, tok, EngineConfig(kernel_cache_dir=cache))
    assert fallback.kernels is None
    prompts = random_prompts(3, 2, 6, seed=1)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    native = CPUEngine(qwen, tok, EngineConfig(decode_kernels="native"))
    assert native.kernels is not None
    assert [o.token_ids for o in fallback.generate(prompts, greedy)] == \
        [o.token_ids for o in native.generate(prompts, greedy)]


def test_a_broken_build_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(nat, "_FLAGS", [*nat._FLAGS, "-DMESHRL_NO_SUCH_HEADER", "-include",
                                        "no_such_header.h"])
    with pytest.raises(nat.NativeUnavailableError, match="compiling"):
        nat.NativeKernels.load(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_native_step_refuses_inputs_it_cannot_index_safely(tok, kernels) -> None:
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    spec = ModelSpec.from_hf_config(model.config)
    w = PackedWeights.pack(spec, model.state_dict())
    cache, ws = KVCache(spec, 2, 8), nat.NativeWorkspace.allocate(w, 2)
    ids, pos, start = torch.tensor([5, 6]), torch.tensor([3, 3]), torch.tensor([0, 1])
    with torch.inference_mode():
        nat.decode_step_native(kernels, w, ids, pos, cache, 3, start, ws)  # fine
        for bad_pos, bad_start, slot in [(pos.int(), start, 3), (pos, start[:1], 3),
                                         (pos, start, 8), (pos[[0, 0, 0]], start, 3)]:
            with pytest.raises(ValueError):
                nat.decode_step_native(kernels, w, ids, bad_pos, cache, slot, bad_start, ws)
