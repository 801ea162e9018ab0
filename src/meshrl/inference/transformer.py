# over 400 lines: the weight packing, prefill (`forward`) and torch decode step share one weight
#  and KV-cache layout and are read together
"""meshrl's own forward pass over Hugging Face Qwen2 / Qwen3 / Llama weights.

Why not call the HF modules: at rollout sizes (hidden 128-512, batch 32-128) one decode step is a
few hundred tiny kernels, and the HF module, cache and mask machinery costs more than the math.
This runs the same math with fewer, larger kernels:
- fused QKV and gate-up weight matrices, built once when weights are loaded, with the RMSNorm
  weights folded in and QKV rows grouped per KV head so no per-step reshape copies;
- RMSNorm in 4 kernels (F.rms_norm decomposes into ~10 on CPU);
- residual adds fused into `addmm` (o_proj and down_proj);
- RoPE as one complex multiply: the rows of each q / k head are permuted at load time so the pair
  (i, i + d/2) that HF's `rotate_half` rotates together is adjacent. q·k is unchanged because both
  sides are permuted alike, and v is not permuted, so outputs are the same;
- a preallocated, left-padded KV cache written in place (all rows write the same slot per step);
- grouped-query decode attention as `baddbmm` + softmax + `bmm`, with no copy of K/V per group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from meshrl.inference.backend import EngineUnsupportedError, WeightLoadError

__all__ = ["ENGINE_FAMILIES", "KVCache", "ModelSpec", "PackedWeights", "WeightLoadError",
           "decode_step", "forward", "qk_norm", "rope_inv_freq"]


ENGINE_FAMILIES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers the forward pass needs, read from a HF config."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int
    tied: bool
    qkv_bias: bool  # Qwen2 has q/k/v biases; Llama has none (attention_bias would bias o_proj too)
    qk_norm: bool = False  # Qwen3: RMSNorm over each q / k head before RoPE
    # Llama 3 RoPE scaling (factor, low_freq_factor, high_freq_factor, original context); None:
    # plain RoPE
    rope_llama3: tuple[float, float, float, int] | None = None

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelSpec:
        """The spec of `config`, or an `EngineUnsupportedError` saying what the engine lacks."""
        model_type = getattr(config, "model_type", "?")
        if model_type not in ENGINE_FAMILIES:
            raise EngineUnsupportedError(f"fast engine: unsupported architecture {model_type!r} "
                                         f"(supported: {', '.join(ENGINE_FAMILIES)})")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", "llama3"):
            raise EngineUnsupportedError(
                f"fast engine: unsupported RoPE type {rope_type!r} (only 'default', 'llama3')")
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            raise EngineUnsupportedError("fast engine: partial rotary embeddings are not supported")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise EngineUnsupportedError(
                f"fast engine: unsupported activation {config.hidden_act!r} (only silu)")
        if getattr(config, "use_sliding_window", False) or "sliding_attention" in (
            getattr(config, "layer_types", None) or []
        ):
            raise EngineUnsupportedError("fast engine: sliding-window attention is not supported")
        if getattr(config, "mlp_bias", False) or (
            model_type != "qwen2" and getattr(config, "attention_bias", False)
        ):
            raise EngineUnsupportedError("fast engine: MLP / o_proj biases are not supported")
        heads = config.num_attention_heads
        kv_heads = config.num_key_value_heads or heads
        if heads % kv_heads:
            raise EngineUnsupportedError(
                f"fast engine: {heads} attention heads do not group over {kv_heads} KV heads")
        llama3 = None
        if rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            if any(rope.get(k) is None for k in keys):
                raise EngineUnsupportedError(f"fast engine: llama3 RoPE scaling needs {keys}")
            llama3 = (float(rope["factor"]), float(rope["low_freq_factor"]),
                      float(rope["high_freq_factor"]),
                      int(rope["original_max_position_embeddings"]))
        return cls(
            model_type=model_type,
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            eps=float(config.rms_norm_eps),
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            max_positions=config.max_position_embeddings,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            rope_llama3=llama3,
        )

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF state-dict key -> shape of every tensor the model needs."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab, d),
            "model.norm.weight": (d,),
        }
        if not self.tied:
            shapes["lm_head.weight"] = (self.vocab, d)
        for i in range(self.layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (q, d),
                p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.o_proj.weight": (d, q),
                p + "mlp.gate_proj.weight": (self.intermediate, d),
                p + "mlp.up_proj.weight": (self.intermediate, d),
                p + "mlp.down_proj.weight": (d, self.intermediate),
            }
            if self.qk_norm:
                shapes |= {p + "self_attn.q_norm.weight": (self.head_dim,),
                           p + "self_attn.k_norm.weight": (self.head_dim,)}
            if self.qkv_bias:
                shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)}
        return shapes


@dataclass
class Layer:
    # the RMSNorm weights are folded into the matrices that follow them: (w * y) @ W = y @ (W w)
    w_qkv: torch.Tensor  # [d, (h + 2 kv) * hd] (transposed view), rows from `_group_qkv`
    b_qkv: torch.Tensor | None  # [(h + 2 kv) * hd]
    w_o: torch.Tensor  # [h * hd, d]
    w_gu: torch.Tensor  # [d, 2 * intermediate]
    w_down: torch.Tensor  # [intermediate, d]
    # Qwen3's q / k norm weights laid out like a KV group's rotated rows: [1 + G, hd] (k, then
    # q G times), permuted like the rows they scale; None without q / k norms
    qk_norm: torch.Tensor | None = None


@dataclass
class PackedWeights:
    spec: ModelSpec
    embed: torch.Tensor  # [vocab, d]
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: torch.Tensor  # [d, vocab] (transposed view)
    rope: torch.Tensor  # [max_positions, hd / 2] complex64: cos + i sin
    eps: torch.Tensor  # RMSNorm epsilon as a 0-d tensor (an operand of addcmul)

    @classmethod
    def pack(cls, spec: ModelSpec, state: dict[str, torch.Tensor]) -> PackedWeights:
        """Check every shape, then fuse and permute; raises WeightLoadError before any change."""
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        expected = spec.expected_shapes()
        optional: dict[str, tuple[int, ...]] = {}
        if spec.tied:  # a live tied model's state dict has it too; must equal the embeddings
            optional["lm_head.weight"] = (spec.vocab, spec.hidden)
        problems = [f"missing {k}" for k in expected if k not in state]
        problems += [f"unexpected {k}" for k in state if k not in expected and k not in optional]
        for k, v in state.items():
            want = expected.get(k) or optional.get(k)
            if want is not None and tuple(v.shape) != want:
                problems.append(f"{k} has shape {tuple(v.shape)}, expected {want}")
            if want is not None and not v.dtype.is_floating_point:
                problems.append(f"{k} has dtype {v.dtype}, expected floating point")
        if (spec.tied and not problems and "lm_head.weight" in state
                and not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])):
            problems.append("lm_head.weight differs from the tied model.embed_tokens.weight")
        if problems:
            more = f"; ... ({len(problems)} problems)" if len(problems) > 6 else ""
            shown = "; ".join(problems[:6]) + more
            raise WeightLoadError(f"weights do not fit the model: {shown}")

        def f32(key: str) -> torch.Tensor:
            return state[key].detach().to(torch.float32)

        perm = _rope_permutation(spec.head_dim)
        layers = []
        for i in range(spec.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            q = _permute_heads(f32(a + "q_proj.weight"), perm, spec.heads)
            k = _permute_heads(f32(a + "k_proj.weight"), perm, spec.kv_heads)
            qkv = _group_qkv(q, k, f32(a + "v_proj.weight"), spec)
            qkv = qkv * f32(p + "input_layernorm.weight")
            bias = None
            if spec.qkv_bias:
                bias = _group_qkv(
                    _permute_heads(f32(a + "q_proj.bias"), perm, spec.heads),
                    _permute_heads(f32(a + "k_proj.bias"), perm, spec.kv_heads),
                    f32(a + "v_proj.bias"), spec)
            qk_norm = None
            if spec.qk_norm:
                g = spec.heads // spec.kv_heads
                qk_norm = torch.stack([f32(a + "k_norm.weight")[perm]]
                                      + [f32(a + "q_norm.weight")[perm]] * g)
            gu = torch.cat([f32(p + "mlp.gate_proj.weight"), f32(p + "mlp.up_proj.weight")])
            gu = gu * f32(p + "post_attention_layernorm.weight")
            layers.append(Layer(
                w_qkv=qkv.t(),
                b_qkv=bias,
                w_o=f32(a + "o_proj.weight").clone().t(),
                w_gu=gu.t(),
                w_down=f32(p + "mlp.down_proj.weight").clone().t(),
                qk_norm=qk_norm,
            ))
        embed = f32("model.embed_tokens.weight").clone()
        head = embed if spec.tied else f32("lm_head.weight").clone()
        return cls(spec, embed, layers, f32("model.norm.weight").clone(), head.t(),
                   rope_table(spec), torch.tensor(spec.eps))


def _rope_permutation(head_dim: int) -> torch.Tensor:
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)


def _permute_heads(w: torch.Tensor, perm: torch.Tensor, heads: int) -> torch.Tensor:
    hd = perm.numel()
    return w.reshape(heads, hd, *w.shape[1:])[:, perm].reshape(w.shape)


def _group_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """Rows ordered per KV head as [v, k, q_1 .. q_G]: then k and the G query heads that share it
    are views of one output row, q reshapes to [B * kv, G, hd] without a copy, and the rotated
    part (k and q) is one contiguous slice."""
    kv, hd, g = spec.kv_heads, spec.head_dim, spec.heads // spec.kv_heads
    rest = q.shape[1:]
    parts = [v.reshape(kv, 1, hd, *rest), k.reshape(kv, 1, hd, *rest), q.reshape(kv, g, hd, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """RoPE's inverse frequencies [hd / 2], in the same float32 ops as HF's rotary embedding
    (`modeling_rope_utils`: the default and Llama 3's `_compute_llama3_parameters`)."""
    dim = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if spec.rope_llama3 is None:
        return inv_freq
    # Llama 3: long wavelengths slowed by `factor`, short ones kept, the band between smoothed
    factor, low, high, context = spec.rope_llama3
    low_wavelen, high_wavelen = context / low, context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_table(spec: ModelSpec) -> torch.Tensor:
    # same float32 ops as HF's rotary embedding: freqs = pos * inv_freq, then cos / sin
    inv_freq = rope_inv_freq(spec)
    freqs = torch.arange(spec.max_positions).float()[:, None] * inv_freq[None, :]
    return torch.complex(freqs.cos(), freqs.sin())


class KVCache:
    """Preallocated keys / values [layers, batch, kv_heads, slots, head_dim], left-padded rows."""

    def __init__(self, spec: ModelSpec, batch: int, slots: int) -> None:
        shape = (spec.layers, batch, spec.kv_heads, slots, spec.head_dim)
        self.k = torch.empty(shape)
        self.v = torch.empty(shape)
        self.batch = batch

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Compact the cache to `rows` (in place: the first len(rows) rows become those rows)."""
        n = rows.numel()
        for buf in (self.k, self.v):
            for layer in range(buf.shape[0]):
                buf[layer, :n] = buf[layer].index_select(0, rows)
        self.batch = n


def _rms(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """x / rms(x), without the weight (folded into the next matrix); 4 kernels, F.rms_norm ~10."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.addcmul(eps, norm, norm, value=1.0 / x.shape[-1]).rsqrt_()


def qk_norm(kq: torch.Tensor, layer: Layer, eps: torch.Tensor) -> torch.Tensor:
    """Qwen3's per-head RMSNorm of the k and q rows [..., 1 + G, hd] (as is without one)."""
    return kq if layer.qk_norm is None else _rms(kq, eps) * layer.qk_norm


def _rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [..., hd] (rotated pairs adjacent) times rot [..., hd/2] complex (broadcast)."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * rot).flatten(-2)


def forward(
    w: PackedWeights,
    ids: torch.Tensor,
    positions: torch.Tensor,
    allowed: torch.Tensor,
    cache: KVCache | None = None,
    real: torch.Tensor | None = None,
    prefix: tuple[KVCache, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Full-sequence pass (prefill / scoring). ids, positions [B, S]; allowed [B, 1, S, S] bool.

    Returns the final-norm hidden states [B, S, d]; with `cache`, fills slots [0, S).
    With `real` (flat indices [T] of the non-padding slots of the [B * S] grid, ascending), the
    norms and matmuls run on those T tokens only, padding is zeros in attention, and the result
    is the hidden states of those tokens [T, d]: left padding of prompts 8-24 tokens long is a
    third of the grid, and of prompt + completion pairs of different lengths often more.

    With `prefix` = (a one-row cache of P tokens every row starts with, pad [B]): ids are the
    last S slots of a left-padded grid of width P + S whose row r holds those P tokens at slots
    [pad_r, pad_r + P) (so its real suffix tokens are the columns >= pad_r here); allowed is
    [B, 1, S, P + S] over that grid, and `cache` (required) gets slots [0, P + S) of every row.
    """
    s = w.spec
    b, n = ids.shape
    h, kv, hd = s.heads, s.kv_heads, s.head_dim
    groups = h // kv
    past, gather = 0, None
    if prefix is not None:
        if cache is None:
            raise ValueError("a prefix needs a cache to write the rows' keys and values into")
        past, pad = prefix[0].k.shape[3], prefix[1]
        # full-grid slot c of row r: prefix token c - pad_r where pad_r <= c < pad_r + P, else
        # column c - P of this grid, i.e. index c of cat([prefix, grid]) (padding: any, masked)
        col = torch.arange(past + n)[None, :]
        inside = (col >= pad[:, None]) & (col < pad[:, None] + past)
        gather = torch.where(inside, col - pad[:, None], col)[:, None, :, None].expand(
            b, kv, past + n, hd)
    rot = w.rope[positions][:, :, None, None, :]  # [B, S, 1, 1, hd/2]
    flat_ids = ids.reshape(-1)
    x = F.embedding(flat_ids if real is None else flat_ids[real], w.embed)
    for i, layer in enumerate(w.layers):
        y = _rms(x, w.eps)
        qkv = F.linear(y, layer.w_qkv.t(), layer.b_qkv)
        if real is not None:  # back onto the grid for attention (padding rows stay zero)
            qkv = qkv.new_zeros(b * n, qkv.shape[1]).index_copy_(0, real, qkv)
        qkv = qkv.view(b, n, kv, groups + 2, hd)
        kq = _rope(qk_norm(qkv[:, :, :, 1:], layer, w.eps), rot)  # [B, S, kv, 1 + G, hd]
        q = kq[:, :, :, 1:].reshape(b, n, h, hd).transpose(1, 2)
        k = kq[:, :, :, 0].transpose(1, 2)
        v = qkv[:, :, :, 0].transpose(1, 2)
        if gather is not None:
            pk, pv = prefix[0].k[i, :1], prefix[0].v[i, :1]
            k = torch.cat([pk.expand(b, -1, -1, -1), k], 2).gather(2, gather)
            v = torch.cat([pv.expand(b, -1, -1, -1), v], 2).gather(2, gather)
        if cache is not None:
            cache.k[i, :b, :, : past + n] = k
            cache.v[i, :b, :, : past + n] = v
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=kv != h)
        att = att.transpose(1, 2).reshape(b * n, h * hd)
        x = x + (att if real is None else att.index_select(0, real)) @ layer.w_o
        y = _rms(x, w.eps)
        gate, up = (y @ layer.w_gu).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ layer.w_down
    out = _rms(x, w.eps) * w.norm
    return out.view(b, n, -1) if real is None else out


def decode_step(
    w: PackedWeights,
    ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    slot: int,
    bias: torch.Tensor,
) -> torch.Tensor:
    """One token per row: ids, positions [B]; writes cache slot `slot`; returns final hidden [B, d].

    bias [B * kv_heads, 1, slots] is 0 where a row may attend and -inf on its left padding.
    """
    s = w.spec
    b = ids.shape[0]
    h, kv, hd = s.heads, s.kv_heads, s.head_dim
    groups = h // kv
    rot = w.rope.index_select(0, positions)[:, None, None, :]  # [B, 1, 1, hd/2]
    bias_t = bias[:, :, : slot + 1]
    scale = hd**-0.5
    x = w.embed.index_select(0, ids)
    for i, layer in enumerate(w.layers):
        y = _rms(x, w.eps)
        qkv = y @ layer.w_qkv if layer.b_qkv is None else torch.addmm(layer.b_qkv, y, layer.w_qkv)
        qkv = qkv.view(b, kv, groups + 2, hd)
        kq = _rope(qk_norm(qkv[:, :, 1:], layer, w.eps), rot)  # [B, kv, 1 + G, hd]
        kc, vc = cache.k[i, :b], cache.v[i, :b]  # [B, kv, slots, hd]
        kc[:, :, slot] = kq[:, :, 0]
        vc[:, :, slot] = qkv[:, :, 0]
        q = kq[:, :, 1:].view(b * kv, groups, hd)
        keys = kc.view(b * kv, -1, hd)[:, : slot + 1]
        scores = torch.baddbmm(bias_t, q, keys.transpose(1, 2), alpha=scale)
        values = vc.view(b * kv, -1, hd)[:, : slot + 1]
        att = torch.bmm(scores.softmax(-1), values).view(b, h * hd)
        x = torch.addmm(x, att, layer.w_o)
        y = _rms(x, w.eps)
        gate, up = (y @ layer.w_gu).chunk(2, dim=-1)
        x = torch.addmm(x, F.silu(gate) * up, layer.w_down)
    return _rms(x, w.eps) * w.norm
