"""`build_backend`: a backend by kind, and `engine_or_reference`: the fast engine where it runs
the model, else the reference backend. Apart from `backend.py` so that the contract module does
not import the backends that import it (the layering test refuses import cycles)."""

from __future__ import annotations

from typing import Any, Literal

from meshrl.inference.backend import EngineUnsupportedError, InferenceBackend
from meshrl.inference.params import EngineConfig, ReferenceConfig

__all__ = ["build_backend", "engine_or_reference", "engine_refusal"]


def engine_refusal(config: Any) -> EngineUnsupportedError | None:
    """Why the fast engine cannot run a model of this HF config, as the typed refusal (its
    one-line message says what); None: it can."""
    from meshrl.inference.transformer import ModelSpec

    try:
        ModelSpec.from_hf_config(config)
    except EngineUnsupportedError as e:
        return e
    return None


def engine_or_reference(
    model: Any, tokenizer: Any, engine: EngineConfig | None = None,
    reference: ReferenceConfig | None = None, version: int = 0,
) -> InferenceBackend:
    """The CPU engine over `model` at policy `version`, or, for a model it cannot run (Qwen2
    with YaRN, Llama with biases, ...), the reference backend over the model itself, with a
    warning naming why."""
    why = engine_refusal(model.config)
    if why is None:
        from meshrl.inference.engine import CPUEngine

        out = CPUEngine(model, tokenizer, engine)
        out.load_weights(model.state_dict(), version)
        return out
    from meshrl.inference.reference import ReferenceBackend
    from meshrl.log import get_logger

    get_logger("meshrl.inference").warning(f"{why}; using the reference backend")
    return ReferenceBackend(model, tokenizer, reference, version)


def build_backend(
    kind: Literal["engine", "reference"], model: Any, tokenizer: Any, max_batch_size: int = 1024,
) -> InferenceBackend:
    """A backend of `kind` over `model` (the engine copies its weights; the reference uses the
    model itself) at policy version 0; "engine" falls back to the reference backend for a
    model the engine cannot run (`engine_or_reference`)."""
    if kind == "engine":
        return engine_or_reference(model, tokenizer, EngineConfig(max_batch_size=max_batch_size),
                                   ReferenceConfig(max_batch_size=max_batch_size))
    if kind == "reference":
        from meshrl.inference.reference import ReferenceBackend

        return ReferenceBackend(model, tokenizer, ReferenceConfig(max_batch_size=max_batch_size))
    raise ValueError(f"unknown inference backend {kind!r} (expected 'engine' or 'reference')")
