from pathlib import Path

import pytest
import torch

from meshrl.cli import main
from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer, save_model


def test_char_tokenizer_roundtrip_and_specials(tmp_path: Path) -> None:
    tok = CharTokenizer()
    ids = tok.encode("12+34=46")
    assert tok.decode(ids) == "12+34=46"
    assert tok.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == "12+34=46"
    assert tok.encode("\u00e9") == [tok.unk_token_id]
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).encode("abc") == tok.encode("abc")
    with pytest.raises(ValueError, match="outside vocabulary"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("preset", ["qwen2-tiny", "llama-tiny"])
def test_preset_roundtrips_through_hf_layout(preset: str, tmp_path: Path) -> None:
    tok = CharTokenizer()
    model = build_model(preset, tok.vocab_size, seed=3)
    assert 0.7e6 < sum(p.numel() for p in model.parameters()) < 0.9e6
    save_model(model, tok, tmp_path / "m")
    assert {"config.json", "model.safetensors", "char_tokenizer.json"} <= {
        p.name for p in (tmp_path / "m").iterdir()
    }
    again = load_model(tmp_path / "m")
    x = torch.tensor([tok.encode("7+8=")])
    with torch.no_grad():
        assert torch.equal(model(x).logits, again(x).logits)


def test_build_is_deterministic_per_seed() -> None:
    a, b, c = (build_model("qwen2-tiny", 99, seed=s) for s in (1, 1, 2))
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_unknown_preset_and_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown model preset"):
        build_model("gpt-17", 10)
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_model(tmp_path)


def test_cli_model_init(tmp_path: Path) -> None:
    assert main(["model", "init", "--out", str(tmp_path / "m"), "--preset", "llama-tiny"]) == 0
    assert load_model(tmp_path / "m").config.model_type == "llama"
