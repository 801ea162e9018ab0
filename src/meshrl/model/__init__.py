"""Policy models: HF causal LMs built from named presets or loaded from local directories."""

from meshrl.model.checkpoint import load_model, read_weights, save_model
from meshrl.model.families import (
    FAMILIES,
    ModelNotFoundError,
    UnsupportedModelError,
    check_model_config,
)
from meshrl.model.presets import PRESETS, build_model, preset_config
from meshrl.model.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "FAMILIES",
    "PRESETS",
    "CharTokenizer",
    "HFTokenizer",
    "ModelNotFoundError",
    "Tokenizer",
    "UnsupportedModelError",
    "build_model",
    "check_model_config",
    "load_model",
    "load_tokenizer",
    "preset_config",
    "read_weights",
    "save_model",
]
