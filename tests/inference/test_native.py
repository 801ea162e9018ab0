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


# head_dim 32 with GQA (query pairs, 8-column blocks), head_dim 12 without GQA (the scalar
# tails), head_dim 64 (one 64-column register block), head_dim 72 with 3 queries per KV head
# (a 64-column block plus an 8-column one; a query pair plus a single query)
SHAPES = {
    "qwen2-tiny": {},
    "llama-tiny": {},
    "qwen2-hd12": {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 4},
    "qwen2-hd64": {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1},
    "llama-hd72-g3": {"hidden_size": 216, "num_attention_heads": 3, "num_key_value_heads": 1},
}


def _step_both(model, kernels, prompts, steps: int, threads: int = 1, onednn: bool = False):
    """Prefill, then `steps` decode steps on the torch and the native path from the same state
    (the native one on oneDNN-prepacked weights with `onednn`)."""
    spec = ModelSpec.from_hf_config(model.config)
    w = PackedWeights.pack(spec, model.state_dict())
    ids, pos, allowed, pad = _left_pad(prompts)
    b, width = ids.shape
    caches = [KVCache(spec, b, width + steps), KVCache(spec, b, width + steps)]
    ws = nat.NativeWorkspace.allocate(w, b)
    packed = nat.prepack(w, b) if onednn else None
    with torch.inference_mode():
        for c in caches:
            h = forward(w, ids, pos, allowed, c)[:, -1]
        bias = _pad_bias(pad, spec, caches[0])
        tok, p = (h @ w.lm_head).argmax(-1), pos[:, -1] + 1
        torch_h, native_h = [], []
        for j in range(steps):
            torch_h.append(decode_step(w, tok, p, caches[0], width + j, bias))
            native_h.append(nat.decode_step_native(kernels, w, tok, p, caches[1], width + j,
                                                   pad, ws, threads=threads, packed=packed))
            tok, p = (torch_h[-1] @ w.lm_head).argmax(-1), p + 1
    return w, torch.stack(torch_h), torch.stack(native_h), caches, pad


@pytest.mark.parametrize(("shape", "onednn"), [(s, False) for s in SHAPES] + [
    ("qwen2-tiny", True), ("llama-hd72-g3", True)])
def test_native_step_equals_torch_step(shape, onednn, tok, kernels, random_prompts) -> None:
    preset = "qwen2-tiny" if shape.startswith("qwen2") else "llama-tiny"
    model = build_model(preset, tok.vocab_size, seed=4, **SHAPES[shape])
    prompts = random_prompts(5, 1, 13, seed=8)  # left padding 0..12: rows attend different spans
    w, th, nh, (ct, cn), pad = _step_both(model, kernels, prompts, steps=11, onednn=onednn)
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


def test_onednn_weights_generate_alike_and_follow_reloads(tok, random_prompts) -> None:
    first, second = (build_model("qwen2-tiny", tok.vocab_size, seed=s) for s in (11, 12))
    prompts = random_prompts(6, 1, 10, seed=4)
    greedy = SamplingParams(max_new_tokens=20, temperature=0)
    on = CPUEngine(first, tok, EngineConfig(decode_kernels="native", onednn_weights="on"))
    off = CPUEngine(first, tok, EngineConfig(decode_kernels="native", onednn_weights="off"))
    assert on.packed is not None and off.packed is None
    assert [o.token_ids for o in on.generate(prompts, greedy)] == \
        [o.token_ids for o in off.generate(prompts, greedy)]
    on.load_weights(second.state_dict(), 1)  # the prepacked copy is rebuilt with the weights
    fresh = CPUEngine(second, tok, EngineConfig(decode_kernels="native", onednn_weights="off"))
    for a, b in zip(on.generate(prompts, greedy), fresh.generate(prompts, greedy), strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_onednn_auto_follows_the_hidden_size(tok) -> None:
    auto = EngineConfig(decode_kernels="native")
    assert CPUEngine(build_model("qwen2-tiny", tok.vocab_size), tok, auto).packed is None
    wide = build_model("qwen2-4l-256", tok.vocab_size)
    assert len(CPUEngine(wide, tok, auto).packed) == wide.config.num_hidden_layers


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
        with pytest.raises(ValueError, match="prepacked layers"):
            nat.decode_step_native(kernels, w, ids, pos, cache, 3, start, ws,
                                   packed=nat.prepack(w, 2)[:-1])


@pytest.mark.parametrize("vocab", [13, 1000, 49152])
def test_token_logprob_equals_argmax_and_log_softmax(kernels, vocab) -> None:
    """The engine's per-step pick: torch's first argmax (ties included) and log_softmax(x / T) at
    the token, to float32 rounding; a row with NaN or inf sends the caller to torch's ops."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g) * 4
    x[0, 3] = x[0, 5] = x[0].max() + 1  # a tie: the first maximum wins, as with torch
    for t in (1.0, 0.7, 2.5):
        tok, lp = kernels.token_logprob(x, None, t)
        assert torch.equal(tok, x.argmax(-1))
        ref = (x / t).log_softmax(-1).gather(1, tok[:, None])[:, 0]
        assert torch.allclose(lp, ref, rtol=0, atol=2e-5)
        given = torch.randint(0, vocab, (6,), generator=g)
        tok, lp = kernels.token_logprob(x, given, t)
        assert torch.equal(tok, given)
        assert torch.allclose(lp, (x / t).log_softmax(-1).gather(1, given[:, None])[:, 0],
                              rtol=0, atol=2e-5)
    for bad in (float("nan"), float("inf"), float("-inf")):
        y = x.clone()
        y[4, 2] = bad
        assert kernels.token_logprob(y, None, 1.0) is None
    with pytest.raises(ValueError, match="vocabulary"):
        kernels.token_logprob(x, torch.tensor([0, 0, 0, 0, 0, vocab]), 1.0)
    with pytest.raises(ValueError, match="float32"):
        kernels.token_logprob(x.double(), None, 1.0)
