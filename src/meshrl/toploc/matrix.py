"""The precision matrix: honest TOPLOC chunks from every compute a pool admits, and cheats.

Calibration of the "any-hardware" profile (issue #26) proves honest completions with every
worker setup of `MATRIX_WORKERS` (the CPU engine in float32; the reference backend in float32,
bfloat16 and float16, sdpa and eager attention, batch 1 to 64) on models of several hidden
sizes, and checks each with a validator in float32 and one in the worker's own dtype (batch 1
to 64, right or left padding). Completion lengths cycle through 1 .. 2 * chunk_size, so every
final-chunk length from 1 to 32 tokens occurs, next to full 32-token chunks.

A completion of length L is the first L tokens of a longer generation: its hidden states are
causal, so they are exactly the ones a generation of L tokens gives.

Files (`file_rows` completions each) are judged with `verdict`, so the pooled tests see the
same mix of full and short chunks a validator sees. The weight cheats (int8, int4, one layer's
MLP x1.1, 1% weight noise, another model) generate with a bfloat16 reference backend and the
float32 CPU engine and are judged the same way. `benchmarks/bench_calibration.py` prints it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from meshrl.inference import (
    CPUEngine,
    EngineConfig,
    ReferenceBackend,
    ReferenceConfig,
    SamplingParams,
)
from meshrl.toploc import perturb
from meshrl.toploc.proofs import DEFAULT_CHUNK_SIZE, ChunkResult, build_proofs, verify_proofs

__all__ = ["MATRIX_VALIDATORS", "MATRIX_WORKERS", "Cheat", "MatrixValidator", "MatrixWorker",
           "cheats", "judge", "prove", "tiny_model"]


@dataclass(frozen=True)
class MatrixWorker:
    name: str
    backend: str  # "engine" (CPU engine, float32) or "reference"
    dtype: str
    batch_size: int
    attn: str = "sdpa"


@dataclass(frozen=True)
class MatrixValidator:
    name: str
    dtype: str  # "float32" or "worker" (the worker's own dtype)
    batch_size: int
    pad_left: bool = False
    attn: str = "sdpa"


MATRIX_WORKERS = (
    MatrixWorker("engine-fp32-b64", "engine", "float32", 64),
    MatrixWorker("ref-fp32-b1", "reference", "float32", 1),
    MatrixWorker("ref-bf16-b8", "reference", "bfloat16", 8),
    MatrixWorker("ref-bf16-b64-eager", "reference", "bfloat16", 64, attn="eager"),
    MatrixWorker("ref-fp16-b16", "reference", "float16", 16),
    MatrixWorker("ref-fp16-b3-eager", "reference", "float16", 3, attn="eager"),
)

MATRIX_VALIDATORS = (
    MatrixValidator("fp32-b16", "float32", 16),
    MatrixValidator("fp32-b64-left-eager", "float32", 64, pad_left=True, attn="eager"),
    MatrixValidator("fp32-b1", "float32", 1),
    MatrixValidator("own-b4-left-eager", "worker", 4, pad_left=True, attn="eager"),
    MatrixValidator("own-b64-left", "worker", 64, pad_left=True),
    MatrixValidator("own-b16-eager", "worker", 16, attn="eager"),
)


def tiny_model(hidden: int, seed: int = 0, vocab: int = 100, layers: int = 2) -> Any:
    """A random-weight Qwen2 model of hidden size `hidden` (head dim 16) in float32."""
    from meshrl.model import build_model

    return build_model("qwen2-tiny", vocab, seed=seed, hidden_size=hidden,
                       intermediate_size=3 * hidden, num_hidden_layers=layers,
                       num_attention_heads=max(1, hidden // 16),
                       num_key_value_heads=max(1, hidden // 32), dtype=torch.float32).eval()


def _variant(model: Any, dtype: str, attn: str) -> Any:
    out = copy.deepcopy(model).to(getattr(torch, dtype))
    out.set_attn_implementation(attn)
    return out.eval()


def prove(model: Any, w: MatrixWorker, prompts: Sequence[list[int]], lengths: Sequence[int],
          seed: int) -> list[tuple[list[int], list[bytes]]]:
    """(completion tokens, proofs) per prompt, completion i cut to lengths[i] tokens."""
    if w.backend == "engine":
        backend: Any = CPUEngine(model, None, EngineConfig(max_batch_size=w.batch_size))
    else:
        backend = ReferenceBackend(_variant(model, w.dtype, w.attn),
                                   cfg=ReferenceConfig(max_batch_size=w.batch_size))
    gens = []
    for lo in range(0, len(prompts), w.batch_size):  # each batch as long as its longest
        hi = min(lo + w.batch_size, len(prompts))
        params = SamplingParams(max_new_tokens=max(lengths[lo:hi]), seed=seed,
                                ignore_eos=True, return_hidden_states=True)
        gens += backend.generate([list(p) for p in prompts[lo:hi]], params, list(range(lo, hi)))
    out = []
    for g, n in zip(gens, lengths, strict=True):
        out.append((g.token_ids[:n], build_proofs(g.hidden_states[:n])))
    return out


def judge(model: Any, v: MatrixValidator, worker_dtype: str, prompts: Sequence[list[int]],
          work: Sequence[tuple[list[int], list[bytes]]]) -> list[list[ChunkResult]]:
    """ChunkResults per completion, recomputed by validator `v` with one prefill."""
    dtype = worker_dtype if v.dtype == "worker" else v.dtype
    cfg = ReferenceConfig(max_batch_size=v.batch_size,
                          score_padding="left" if v.pad_left else "right")
    backend = ReferenceBackend(_variant(model, dtype, v.attn), cfg=cfg)
    res = backend.score([list(p) for p in prompts], [t for t, _ in work])
    return [verify_proofs(r.hidden_states, proofs, DEFAULT_CHUNK_SIZE)
            for r, (_, proofs) in zip(res, work, strict=True)]


@dataclass(frozen=True)
class Cheat:
    name: str
    change: Callable[[Any], Any]


def cheats(hidden: int, real: bool = False) -> list[Cheat]:
    """The weight cheats a validator must reject at file level. `real`: those of a pretrained
    model (issue #40): also one layer x1.01, two layers swapped, and another model of the same
    architecture re-initialised (the tiny models' "other model" is another random seed)."""
    other = _reinit if real else (lambda m: tiny_model(hidden, seed=12345,
                                                       vocab=m.config.vocab_size,
                                                       layers=m.config.num_hidden_layers))
    out = [
        Cheat("int8", lambda m: perturb.quantize_weights(m, 8)),
        Cheat("int4", lambda m: perturb.quantize_weights(m, 4)),
        Cheat("layer_mlp_x1.1", lambda m: perturb.scale_layer_mlp(m, 1.1)),
        Cheat("noise_0.01", lambda m: perturb.noise_weights(m, 0.01)),
        Cheat("other_model", other),
    ]
    if real:
        out[3:3] = [Cheat("layer_mlp_x1.01", lambda m: perturb.scale_layer_mlp(m, 1.01))]
        out.append(Cheat("layers_swapped", perturb.swap_layers))
    return out


def _reinit(model: Any, seed: int = 12345) -> Any:
    """A model of `model`'s architecture and config with freshly initialised weights."""
    torch.manual_seed(seed)
    return type(model)(model.config).to(torch.float32).eval()
