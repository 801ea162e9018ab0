"""Config models of the inference engine: how to sample, and how the CPU engine runs (no torch)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from meshrl.config import Config

__all__ = ["ComputeDtype", "DeviceName", "EngineConfig", "ReferenceConfig", "SamplingParams",
           "check_compute"]

# Where and in what precision a model role computes (worker, validator): the fast CPU engine is
# `cpu` + `float32` only; the reference backend runs on any of them (`meshrl.inference.device`).
DeviceName = Annotated[str, StringConstraints(pattern=r"^(cpu|cuda(:[0-9]{1,2})?)$")]
ComputeDtype = Literal["float32", "bfloat16", "float16"]


def check_compute(backend: str, device: str, dtype: str) -> None:
    """The CPU engine computes on the CPU in float32: anything else needs the reference
    backend (a one-line ValueError, raised at config load)."""
    if backend == "engine" and dtype != "float32":
        raise ValueError(f"dtype: the engine computes in float32; {dtype} needs backend = "
                         "\"reference\"")
    if backend == "engine" and device != "cpu":
        raise ValueError(f"device: the engine runs on the CPU; {device} needs backend = "
                         "\"reference\" (no GPU fast path yet: benchmarks/README.md)")


class SamplingParams(Config):
    """How to sample one batch: the one parameter type of every backend's `generate`.

    The tokenizer's EOS stops a completion unless `ignore_eos` is set.
    """

    max_new_tokens: int = Field(64, ge=1, description="tokens to generate at most per prompt")
    temperature: float = Field(1.0, ge=0.0, description="softmax temperature; 0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept before sampling")
    seed: int = Field(0, ge=0, lt=2**64, description="seed of the replayable Gumbel noise")
    stop_token_ids: tuple[int, ...] = Field((), description="extra token ids that end a completion")
    stop_strings: tuple[str, ...] = Field((), description="strings that end a completion")
    ignore_eos: bool = Field(
        False, description="generate past EOS (fixed-length completions for benchmarks and "
        "calibration); stop tokens and strings still stop"
    )
    return_hidden_states: bool = Field(
        False, description="return final hidden states (engine: EngineConfig.hidden_dtype; "
        "reference: the model's dtype)"
    )


class EngineConfig(Config):
    """How the CPU engine runs (`meshrl.inference.engine.CPUEngine`)."""

    max_batch_size: int = Field(128, ge=1, description="rows per forward; more prompts run in turn")
    max_seq_len: int | None = Field(
        None, ge=2, description="context length (prompt + completion); default: the model's"
    )
    num_threads: int = Field(
        0, ge=0, description="torch intra-op threads during engine calls; 0 = torch's setting"
    )
    hidden_dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16", description="dtype of returned hidden states"
    )
    decode_kernels: Literal["auto", "native", "torch"] = Field(
        "auto", description="decode step: native fused kernels (built with the C++ compiler once "
        "per machine), torch ops, or auto = native when it builds, else torch"
    )
    onednn_weights: Literal["auto", "on", "off"] = Field(
        "auto", description="native decode: matmuls through oneDNN on weights reordered once at "
        "load (a second copy of the layer weights), or MKL mm on the dense ones; auto = oneDNN "
        "from hidden size 256 (where it starts to pay: benchmarks/README.md, "
        "bench_decode_matmul.py)"
    )
    kernel_cache_dir: str | None = Field(
        None, description="cache of the built native kernels; default ~/.cache/meshrl/kernels"
    )
    share_prompts: bool = Field(
        True, description="prefill each distinct prompt of a batch once and copy its KV cache to "
        "the rows that repeat it (a worker's group_size samples per prompt); off: every row"
    )
    compact_below: float = Field(
        0.75, ge=0.0, le=1.0, description="drop finished rows when the alive fraction falls below"
    )


class ReferenceConfig(Config):
    """How the reference backend batches (`meshrl.inference.reference.ReferenceBackend`).

    Its batching only changes float noise, which is what the TOPLOC validator's honest
    recompute modes vary on purpose.
    """

    max_batch_size: int = Field(1024, ge=1, description="rows per forward; more run in turn")
    score_padding: Literal["left", "right"] = Field(
        "right", description="which side `score` pads a batch's sequences on"
    )
    score_pad_to: int = Field(0, ge=0, description="`score` pads every batch to this width")
