"""Named model presets: tiny Qwen2 / Llama architectures built from a config, no download needed."""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "build_model", "preset_config"]

# name -> (architecture, config kwargs). vocab_size is filled from the tokenizer at build time.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    # ~0.8M parameters with the character tokenizer: the synthetic-task workhorse.
    "qwen2-tiny": (
        "qwen2",
        dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
    ),
    "llama-tiny": (
        "llama",
        dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
    ),
    # 4 layers, hidden 256: the size TOPLOC calibration is reported on.
    "qwen2-4l-256": (
        "qwen2",
        dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
    ),
    # ~25M parameters: the "bigger" benchmark size.
    "qwen2-25m": (
        "qwen2",
        dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512),
    ),
}


def preset_config(name: str, vocab_size: int, **overrides: Any) -> Any:
    """The `transformers` config object for preset `name` with the given vocabulary size."""
    from transformers import LlamaConfig, Qwen2Config

    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    arch, kwargs = PRESETS[name]
    kwargs = {**kwargs, "vocab_size": vocab_size, "tie_word_embeddings": True, **overrides}
    cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    return cls(**kwargs)


def build_model(
    name: str, vocab_size: int, seed: int = 0, dtype: Any = None, **overrides: Any
) -> Any:
    """A randomly initialised causal LM for preset `name` (deterministic for a given seed)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = preset_config(name, vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
