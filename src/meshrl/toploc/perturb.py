"""Subtle model changes a cheating worker might make, for calibration and detection tests.

Each function returns a perturbed deep copy and leaves the input model untouched.
- `scale_layer_mlp`: multiply one decoder layer's MLP output projection by a factor.
- `noise_weights`: add Gaussian noise of `rel` times each tensor's RMS to every parameter.
- `swap_layers`: exchange two decoder layers (another model of the same shape and weights).
- `quantize_weights`: round every decoder Linear weight to `bits`-bit symmetric integers per
  output row (round to nearest, scale = max|w| / (2^(bits-1) - 1)), then back to float.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["noise_weights", "quantize_tensor", "quantize_weights", "scale_layer_mlp",
           "swap_layers"]


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.model.layers  # HF Qwen2 / Llama layout


@torch.no_grad()
def scale_layer_mlp(model: torch.nn.Module, factor: float, layer: int | None = None):
    """Copy of `model` with layer `layer` (default: the middle one) MLP output scaled."""
    out = copy.deepcopy(model)
    layers = _layers(out)
    idx = len(layers) // 2 if layer is None else layer
    w = layers[idx].mlp.down_proj.weight
    w.copy_((w.float() * factor).to(w.dtype))
    return out


@torch.no_grad()
def noise_weights(model: torch.nn.Module, rel: float, seed: int = 0):
    """Copy of `model` with N(0, (rel * rms(p))^2) added to every parameter p."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    for p in out.parameters():
        f = p.float()
        rms = f.pow(2).mean().sqrt()
        p.copy_((f + torch.randn(f.shape, generator=gen) * rel * rms).to(p.dtype))
    return out


def quantize_tensor(w: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric per-row round-to-nearest quantization to `bits` bits, returned dequantized."""
    if bits < 2:
        raise ValueError(f"bits must be >= 2, got {bits}")
    f = w.float()
    qmax = 2 ** (bits - 1) - 1
    scale = f.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / qmax
    return ((f / scale).round().clamp(-qmax, qmax) * scale).to(w.dtype)


@torch.no_grad()
def quantize_weights(model: torch.nn.Module, bits: int):
    """Copy of `model` with every Linear weight inside the decoder layers quantized."""
    out = copy.deepcopy(model)
    for layer in _layers(out):
        for mod in layer.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(quantize_tensor(mod.weight, bits))
    return out


@torch.no_grad()
def swap_layers(model: torch.nn.Module, i: int | None = None, j: int | None = None):
    """Copy of `model` with decoder layers i and j (default: the middle one and the next)
    exchanged: the same weights, the same shape, another function."""
    out = copy.deepcopy(model)
    layers = _layers(out)
    i = len(layers) // 2 if i is None else i
    j = i + 1 if j is None else j
    a, b = layers[i], layers[j]
    layers[i], layers[j] = b, a
    for idx, layer in enumerate(layers):  # the KV cache is indexed by each layer's own index
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = idx
    return out
