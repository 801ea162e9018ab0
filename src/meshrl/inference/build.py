"""`build_backend`: a backend by kind. Apart from `backend.py` so that the contract module does
not import the backends that import it (the layering test refuses import cycles)."""

from __future__ import annotations

from typing import Any, Literal

from meshrl.inference.backend import InferenceBackend

__all__ = ["build_backend"]


def build_backend(
    kind: Literal["engine", "reference"], model: Any, tokenizer: Any, max_batch_size: int = 1024,
) -> InferenceBackend:
    """A backend of `kind` over `model` (the engine copies its weights; the reference uses the
    model itself) at policy version 0."""
    if kind == "engine":
        from meshrl.inference.engine import CPUEngine
        from meshrl.inference.params import EngineConfig

        return CPUEngine(model, tokenizer, EngineConfig(max_batch_size=max_batch_size))
    if kind == "reference":
        from meshrl.inference.params import ReferenceConfig
        from meshrl.inference.reference import ReferenceBackend

        return ReferenceBackend(model, tokenizer, ReferenceConfig(max_batch_size=max_batch_size))
    raise ValueError(f"unknown inference backend {kind!r} (expected 'engine' or 'reference')")
