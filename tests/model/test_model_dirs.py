"""A model directory of a known family goes through the trainer's save and shardcast's manifest
as it is: shards, index, generation config (every stop token), tokenizer and chat template."""

from __future__ import annotations

import json

import torch

from hf_families import save_family
from meshrl.model import FAMILIES, load_model, load_tokenizer, save_model
from meshrl.shardcast.manifest import build_manifest


def test_trainer_save_keeps_the_directory_usable_as_it_came(tmp_path) -> None:
    src = save_family("qwen3-untied-mqa", tmp_path / "hub", seed=1)
    model, tok = load_model(src), load_tokenizer(src)
    assert set(FAMILIES) == {"qwen2", "qwen3", "llama"}
    out = save_model(model, tok, tmp_path / "policy")
    again, tok2 = load_model(out), load_tokenizer(out)
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items(),
                               strict=True):
        assert k == k2 and torch.equal(a, b), k
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == list(tok.eos_token_ids) == list(tok2.eos_token_ids)
    assert tok2.has_chat_template
    assert tok2.chat_prompt("hi") == tok.chat_prompt("hi")
    assert tok2.encode("What is 12 + 30?") == tok.encode("What is 12 + 30?")


def test_shardcast_publishes_every_file_of_a_sharded_directory(tmp_path) -> None:
    src = save_family("llama3.1-untied", tmp_path / "hub")
    manifest = build_manifest(src, 1, 1 << 16)
    names = {f.name for f in manifest.files}
    shards = {p.name for p in src.glob("model-*-of-*.safetensors")}
    assert len(shards) >= 2 and shards <= names
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json"} <= names
