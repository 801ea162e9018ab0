"""The decode step with fused native kernels between the matmuls (`decode_kernels.cpp`).

Why: at rollout sizes a torch decode step is ~25 small kernels per layer, and on a 2-core CPU
their dispatch, thread-pool wake-ups and the batched tiny matmuls of attention cost more than the
math (profiled in benchmarks/README.md, `bench_inference.py`). Here each layer is 4 matmuls and
3 native calls: RMSNorm, RoPE + cache write + attention over each row's own slots (no padding is
touched), SiLU * up.

The matmuls go through oneDNN with the weights reordered once, at load, into its blocked layout
(`prepack`): MKL's `mm` repacks each weight matrix on every call, and once the weights no longer
fit in the last-level cache (qwen2-25m: 100 MB) that repacking streams them twice per step
(what that gains, per model size, is measured in benchmarks/README.md: `bench_decode_matmul.py`
and `bench_inference.py`). Without oneDNN they stay MKL `mm` into preallocated buffers.

The kernels are plain C ABI over raw pointers, loaded with ctypes: no torch headers, so the
compile takes a few seconds (g++ / c++), once per machine; the library is cached under
`cache_dir` keyed by a hash of the source, the flags and the CPU. Without a compiler the engine
keeps the torch path (`transformer.decode_step`), which computes the same function.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from meshrl.inference.backend import InferenceError
from meshrl.inference.transformer import KVCache, PackedWeights, qk_norm

__all__ = [
    "NativeKernels",
    "NativeUnavailableError",
    "NativeWorkspace",
    "PrepackedLayer",
    "default_cache_dir",
    "prepack",
]

_SOURCE = Path(__file__).with_name("decode_kernels.cpp")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC"]
# attention work (rows x heads x slots x head_dim) from which waking torch's OpenMP threads pays
_PARALLEL_WORK = 1 << 16
_loaded: dict[Path, NativeKernels] = {}


class NativeUnavailableError(InferenceError):
    """The native decode kernels cannot be built or loaded on this machine."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "meshrl" / "kernels"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _compiler() -> str:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    raise NativeUnavailableError("no C++ compiler (g++, c++ or clang++) on PATH")


def _build(cache_dir: Path) -> Path:
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(_FLAGS).encode() + _cpu_id().encode()).hexdigest()
    lib = cache_dir / f"meshrl_decode_{key[:16]}.so"
    if lib.is_file():
        return lib
    cxx = _compiler()
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *_FLAGS, "-o", tmp, str(_SOURCE)], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0:
            raise NativeUnavailableError(f"compiling {_SOURCE.name} failed: {proc.stderr[-2000:]}")
        os.replace(tmp, lib)  # atomic: concurrent builders each install a complete file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class NativeKernels:
    """The loaded kernel library (one per process and cache directory)."""

    def __init__(self, path: Path) -> None:
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise NativeUnavailableError(f"cannot load {path}: {e}") from e
        self.path = path
        self.rms = lib.meshrl_rms
        self.rms.argtypes = [_P, _P, _P, _I, _I, _F]
        self.silu_mul = lib.meshrl_silu_mul
        self.silu_mul.argtypes = [_P, _P, _I, _I, _I]
        self.attend = lib.meshrl_attend
        self.attend.argtypes = [_P, _P, _P, _P, _P, _P, _P, *[_I] * 6, _F, _I]
        self._gumbel_u = lib.meshrl_gumbel_u
        self._gumbel_u.argtypes = [_P, ctypes.c_int64, _P, _P, _I, _I]
        for fn in (self.rms, self.silu_mul, self.attend, self._gumbel_u):
            fn.restype = None
        self._token_logprob = lib.meshrl_token_logprob
        self._token_logprob.argtypes = [_P, _P, _P, _I, _I, _F, _I]
        self._token_logprob.restype = _I

    def token_logprob(self, logits: torch.Tensor, tok: torch.Tensor | None,
                      temperature: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(tok, log_softmax(logits / temperature)[tok]) per row, tok = the greedy argmax when
        None: the engine's per-step pick in two passes over each row instead of argmax +
        log_softmax + gather (log-probs equal torch's to float32 rounding). None when a row is
        not finite (the caller then uses torch's ops)."""
        if (logits.dtype != torch.float32 or logits.dim() != 2 or not logits.is_contiguous()
                or logits.is_cuda or not temperature > 0):
            raise ValueError("logits must be a contiguous 2-d float32 CPU tensor, temperature > 0")
        rows, vocab = logits.shape
        if tok is None:
            out = torch.empty(rows, dtype=torch.int64)
        else:
            if tok.shape != (rows,) or tok.dtype != torch.int64:
                raise ValueError(f"tok must be int64 of shape ({rows},)")
            if rows and not (int(tok.min()) >= 0 and int(tok.max()) < vocab):
                raise ValueError("tok outside the vocabulary")
            out = tok.contiguous().clone()
        lp = torch.empty(rows)
        bad = self._token_logprob(logits.data_ptr(), out.data_ptr(), lp.data_ptr(), rows, vocab,
                                  temperature, int(tok is None))
        return None if bad else (out, lp)

    def gumbel_u(self, base: torch.Tensor, position: int, vocab_hash: torch.Tensor) -> torch.Tensor:
        """The sampler's u [rows, vocab] (float64) at `position`: `sampling.BatchSampler.noise`
        before its two logs, bit for bit, in one pass instead of ~15 int64 tensor ops."""
        for name, t in (("base", base), ("vocab_hash", vocab_hash)):
            if t.dtype != torch.int64 or t.dim() != 1 or not t.is_contiguous() or t.is_cuda:
                raise ValueError(f"{name} must be a contiguous 1-d int64 CPU tensor")
        u = torch.empty(base.shape[0], vocab_hash.shape[0], dtype=torch.float64)
        self._gumbel_u(base.data_ptr(), position & 0xFFFFFFFF, vocab_hash.data_ptr(),
                       u.data_ptr(), base.shape[0], vocab_hash.shape[0])
        return u

    @classmethod
    def load(cls, cache_dir: Path | None = None) -> NativeKernels:
        """Build (first time on this machine) and load; raises NativeUnavailableError."""
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        if cache_dir not in _loaded:
            try:
                lib = _build(cache_dir)
            except (OSError, subprocess.SubprocessError) as e:
                raise NativeUnavailableError(f"cannot build the decode kernels: {e}") from e
            _loaded[cache_dir] = cls(lib)
        return _loaded[cache_dir]


@dataclass
class NativeWorkspace:
    """Buffers of one generation batch, reused by every decode step (views [:b] after compaction).

    start [B] int64: each row's first real cache slot (its left padding); rows that leave the
    batch are compacted out of it like the cache.
    """

    x: torch.Tensor
    y: torch.Tensor
    qkv: torch.Tensor
    att: torch.Tensor
    gu: torch.Tensor
    act: torch.Tensor

    @classmethod
    def allocate(cls, w: PackedWeights, batch: int) -> NativeWorkspace:
        s = w.spec
        e = torch.empty
        return cls(x=e(batch, s.hidden), y=e(batch, s.hidden),
                   qkv=e(batch, (s.heads + 2 * s.kv_heads) * s.head_dim),
                   att=e(batch, s.heads * s.head_dim), gu=e(batch, 2 * s.intermediate),
                   act=e(batch, s.intermediate))


@dataclass
class PrepackedLayer:
    """One layer's matrices in oneDNN's blocked layout (opaque tensors), for `_linear_pointwise`."""

    qkv: torch.Tensor
    o: torch.Tensor
    gu: torch.Tensor
    down: torch.Tensor


def prepack(w: PackedWeights, batch: int) -> list[PrepackedLayer] | None:
    """Each layer's matrices reordered for oneDNN (tuned for `batch` rows); None without oneDNN.

    Memory: a second copy of the layer weights. The dense ones stay for prefill and scoring.
    """
    if not torch.backends.mkldnn.is_available():
        return None
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return None

    def reorder(m: torch.Tensor) -> torch.Tensor:  # m is [in, out]; oneDNN wants [out, in]
        return ops._reorder_linear_weight(m.t().contiguous(), batch)

    return [PrepackedLayer(reorder(layer.w_qkv), reorder(layer.w_o), reorder(layer.w_gu),
                           reorder(layer.w_down)) for layer in w.layers]


def decode_step_native(
    kern: NativeKernels,
    w: PackedWeights,
    ids: torch.Tensor,
    positions: torch.Tensor,
    cache: KVCache,
    slot: int,
    start: torch.Tensor,
    ws: NativeWorkspace,
    threads: int | None = None,
    packed: list[PrepackedLayer] | None = None,
) -> torch.Tensor:
    """`transformer.decode_step` with fused kernels; start [B] int64 replaces the bias mask.

    Attention runs on `threads` threads (default: torch's count once the work pays for them).
    With `packed` (from `prepack(w, ...)`) the matmuls run on those oneDNN weights.
    """
    s = w.spec
    b = ids.shape[0]
    # the kernels index raw memory: check what they trust (cheap next to a step)
    for name, t in (("positions", positions), ("start", start)):
        if t.dtype != torch.int64 or not t.is_contiguous() or t.shape != (b,):
            raise ValueError(f"{name} must be a contiguous int64 tensor of shape ({b},)")
    if not (b <= ws.x.shape[0] and b <= cache.batch and 0 <= slot < cache.k.shape[3]):
        raise ValueError(f"batch {b} / slot {slot} outside the workspace or cache")
    if packed is not None and len(packed) != len(w.layers):
        raise ValueError(f"{len(packed)} prepacked layers for a {len(w.layers)}-layer model")
    d, kv, hd = s.hidden, s.kv_heads, s.head_dim
    x, y, qkv, att = ws.x[:b], ws.y[:b], ws.qkv[:b], ws.att[:b]
    gu, act = ws.gu[:b], ws.act[:b]
    torch.index_select(w.embed, 0, ids, out=x)
    eps, slots = s.eps, cache.k.shape[3]
    layer_bytes = cache.k.stride(0) * cache.k.element_size()
    k0, v0 = cache.k.data_ptr(), cache.v.data_ptr()
    rope = torch.view_as_real(w.rope).data_ptr()
    pos_p, start_p = positions.data_ptr(), start.data_ptr()
    py, pa = y.data_ptr(), att.data_ptr()
    if threads is None:
        big = b * s.heads * (slot + 1) * hd >= _PARALLEL_WORK
        threads = torch.get_num_threads() if big else 1
    # oneDNN's `_linear_pointwise` has no out=: x, qkv and gu are rebound to its results; its
    # "add" variant fuses the residual (linear(a) + x) as addmm_ does on the MKL path
    linear = torch.ops.mkldnn._linear_pointwise if packed is not None else None
    for i, layer in enumerate(w.layers):
        pk = packed[i] if packed is not None else None
        kern.rms(x.data_ptr(), py, None, b, d, eps)
        if pk is not None:
            qkv = linear(y, pk.qkv, layer.b_qkv, "none", [], "")
        elif layer.b_qkv is None:
            torch.mm(y, layer.w_qkv, out=qkv)
        else:
            torch.addmm(layer.b_qkv, y, layer.w_qkv, out=qkv)
        if layer.qk_norm is not None:  # Qwen3: in place, before the kernel's RoPE
            kq = qkv.view(b, kv, s.heads // kv + 2, hd)[:, :, 1:]
            kq.copy_(qk_norm(kq, layer, w.eps))
        kern.attend(qkv.data_ptr(), rope, pos_p, start_p, k0 + i * layer_bytes,
                    v0 + i * layer_bytes, pa, b, kv, s.heads // kv, hd, slots, slot, hd**-0.5,
                    threads)
        x = linear.binary(att, x, pk.o, None, "add") if pk is not None else x.addmm_(att, layer.w_o)
        kern.rms(x.data_ptr(), py, None, b, d, eps)
        if pk is not None:
            gu = linear(y, pk.gu, None, "none", [], "")
        else:
            torch.mm(y, layer.w_gu, out=gu)
        kern.silu_mul(gu.data_ptr(), act.data_ptr(), b, s.intermediate, 1)
        x = (linear.binary(act, x, pk.down, None, "add") if pk is not None
             else x.addmm_(act, layer.w_down))
    out = torch.empty(b, d)
    kern.rms(x.data_ptr(), out.data_ptr(), w.norm.data_ptr(), b, d, eps)
    return out
