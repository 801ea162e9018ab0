"""LoraPolicy: the options shape the adapters the trainer trains, and the effective weights it
states are the documented merge of them, what peft itself computes to rounding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from meshrl.config import load_config
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.rl.config import LoraConfig, RLConfig
from meshrl.rl.lora import LoraPolicy
from meshrl.shardcast.adapter import materialize, read_weights, weights_sha256

TOK = CharTokenizer()
Q = "model.layers.0.self_attn.q_proj.weight"


def _policy(tmp_path, **cfg) -> LoraPolicy:
    model = build_model("qwen2-tiny", TOK.vocab_size, seed=2)
    save_model(model, TOK, tmp_path / "base")
    policy = LoraPolicy(model, tmp_path / "base", LoraConfig(enabled=True, **cfg), seed=4)
    with torch.no_grad():  # a trained adapter: B away from its zero init
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn_like(p))
    return policy


@pytest.mark.parametrize("rslora", [False, True])
def test_alpha_rank_and_rslora_set_the_scale_of_the_effective_weights(tmp_path, rslora):
    policy = _policy(tmp_path, rank=4, alpha=12.0, rslora=rslora)
    scale = 12.0 / (2.0 if rslora else 4.0)
    state = policy.adapter_state()
    a = state["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = state["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    base = read_weights(tmp_path / "base")["model.safetensors"][Q]
    effective = policy.effective_state()[Q]
    torch.testing.assert_close(effective, torch.from_numpy(base) + scale * (b @ a),
                               rtol=1e-5, atol=1e-6)
    # peft's own forward (unmerged) is the function of the effective weights
    ids = torch.randint(0, TOK.vocab_size, (2, 12))
    plain = policy.plain_model()
    with torch.no_grad():
        torch.testing.assert_close(policy.model(input_ids=ids).logits,
                                   plain(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    policy.save_version(tmp_path / "version")
    cfg = json.loads((tmp_path / "version" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["use_rslora"]) == (4, 12.0, rslora)
    # a receiver rebuilds exactly the stated weights from the version's files and the base
    digest = materialize(tmp_path / "version", tmp_path / "base", tmp_path / "rebuilt")
    assert digest == policy.effective_sha256()
    rebuilt = read_weights(tmp_path / "rebuilt")["model.safetensors"]
    assert np.array_equal(rebuilt[Q], effective.numpy())
    assert weights_sha256(rebuilt) == digest


def test_target_modules_choose_the_layers_that_get_adapters(tmp_path):
    policy = _policy(tmp_path, rank=2, target_modules=("q_proj", "down_proj"))
    modules = {k.split(".")[-3] for k in policy.adapter_state()}
    assert modules == {"q_proj", "down_proj"}
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    layers, hidden, inter = 4, 128, 384
    assert trainable == layers * 2 * ((hidden + hidden) + (inter + hidden))
    effective = policy.effective_state()
    base = read_weights(tmp_path / "base")["model.safetensors"]
    k = "model.layers.0.self_attn.k_proj.weight"  # no adapter: the base, bit for bit
    assert np.array_equal(effective[k].numpy(), base[k])
    assert not np.array_equal(effective[Q].numpy(), base[Q])


def test_dropout_other_than_zero_and_adapter_broadcast_without_lora_are_refused():
    with pytest.raises(Exception, match="less than or equal to 0"):
        LoraConfig(dropout=0.1)
    with pytest.raises(Exception, match=r"needs lora\.enabled"):
        load_config(RLConfig, [], ["--network.broadcast", "adapter"])
    assert load_config(RLConfig, [], ["--network.broadcast", "adapter",
                                      "--lora.enabled", "true"]).lora.enabled
