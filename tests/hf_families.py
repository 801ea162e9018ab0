"""Small random-weight models of the families people train with RL, in the Hugging Face layout.

Each config dict keeps its family's real `config.json` keys (Qwen2.5-0.5B-Instruct, Qwen3-0.6B /
Qwen3-8B, Llama-3.1-8B, Llama-3.2-1B), with layers and widths shrunk. `save_family` writes what
a hub download holds: `config.json`, sharded `*.safetensors` (+ index), `generation_config.json`
with the family's list of stop tokens, and a byte-level BPE tokenizer trained here
(`tokenizer.json`, `tokenizer_config.json`, a ChatML chat template). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "What is 12 + 30? The answer is 42.", "Reverse the word 'meshrl': lrhsem.",
    "Compute 7 * 6 and give the number.", "A pool trains a policy from verified rollouts.",
    "The quick brown fox jumps over the lazy dog 0123456789 times.",
] * 20

_SHRUNK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2)

# family name -> config.json (vocab_size and token ids are set from the tokenizer)
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-tied": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
        "initializer_range": 0.02, "max_position_embeddings": 32768, "max_window_layers": 21,
        "model_type": "qwen2", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, **_SHRUNK,
    },
    "qwen3-tied": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "head_dim": 32, "hidden_act": "silu", "initializer_range": 0.02,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, **_SHRUNK,
    },
    "qwen3-untied-mqa": {  # Qwen3-8B is untied; one KV head for all query heads
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "head_dim": 16, "hidden_act": "silu", "initializer_range": 0.02,
        "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, **{**_SHRUNK, "num_key_value_heads": 1},
    },
    "llama3.1-untied": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, **_SHRUNK,
    },
    "llama3.2-tied": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "head_dim": 16, "hidden_act": "silu", "initializer_range": 0.02,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, **{**_SHRUNK, "num_attention_heads": 4, "num_key_value_heads": 2},
    },
}


def bpe_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE tokenizer trained on a small corpus, with ChatML specials and template
    (a `transformers` fast tokenizer: `save_pretrained` writes the HF layout)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML)


def family_model(name: str, vocab_size: int, seed: int = 0) -> Any:
    """A random-weight model of family `name`; norms and biases are random too (the HF init
    makes them ones / zeros, which would hide a misplaced one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(FAMILY_CONFIGS[name])
    config = AutoConfig.for_model(data.pop("model_type"), vocab_size=vocab_size, **data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.ndim == 1:
                    p.copy_(torch.rand_like(p) + 0.5 if "norm" in pname
                            else torch.randn_like(p) * 0.1)
    return model.float().eval()


def save_family(name: str, directory: Path, seed: int = 0, shard: str = "200KB") -> Path:
    """A model directory of family `name` as a hub download lays it out (sharded safetensors)."""
    from transformers import GenerationConfig

    tok = bpe_tokenizer()
    model = family_model(name, len(tok), seed)
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.config.eos_token_id = stops[0]
    model.config.pad_token_id = stops[1]
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=stops[1])
    model.save_pretrained(str(directory), safe_serialization=True, max_shard_size=shard)
    tok.save_pretrained(str(directory))
    return directory
