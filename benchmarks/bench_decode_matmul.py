"""The decode step's matmuls: oneDNN on prepacked weights vs MKL `mm`, per model width.

For each preset the layers' four matrices (QKV, O, gate-up, down) are multiplied by a batch of
decode rows, all layers in turn, as the engine's decode step does; each side's best of
`--repeats` timed loops counts. `speedup` = MKL time / oneDNN time (above 1: prepacking pays).
This is the measurement behind `EngineConfig.onednn_weights = "auto"` (oneDNN from hidden 256).

    python benchmarks/bench_decode_matmul.py [--presets qwen2-tiny,qwen2-4l-256,qwen2-25m]
        [--batches 32,128] [--repeats 3] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from meshrl.inference.native import prepack
from meshrl.inference.transformer import ModelSpec, PackedWeights
from meshrl.model import CharTokenizer, build_model


def best_seconds(fn, repeats: int, min_seconds: float = 0.3) -> float:
    """Best per-call time over `repeats` loops of at least `min_seconds` each."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_seconds:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def bench(preset: str, batch: int, repeats: int) -> dict:
    tok = CharTokenizer()
    model = build_model(preset, tok.vocab_size, seed=0)
    spec = ModelSpec.from_hf_config(model.config)
    w = PackedWeights.pack(spec, model.state_dict())
    packed = prepack(w, batch)
    if packed is None:
        raise SystemExit("this torch has no oneDNN (torch.backends.mkldnn)")
    mats = [(layer.w_qkv, layer.w_o, layer.w_gu, layer.w_down) for layer in w.layers]
    inputs = [torch.randn(batch, m.shape[0]) for m in mats[0]]
    outs = [torch.empty(batch, m.shape[1]) for m in mats[0]]
    linear = torch.ops.mkldnn._linear_pointwise

    def mkl() -> None:
        for layer in mats:
            for x, m, o in zip(inputs, layer, outs, strict=True):
                torch.mm(x, m, out=o)

    def onednn() -> None:
        for pk in packed:
            for x, m in zip(inputs, (pk.qkv, pk.o, pk.gu, pk.down), strict=True):
                linear(x, m, None, "none", [], "")

    t_mkl, t_dnn = best_seconds(mkl, repeats), best_seconds(onednn, repeats)
    flops = 2 * batch * sum(m.numel() for layer in mats for m in layer)
    return {
        "bench": "decode_matmul", "preset": preset, "hidden": spec.hidden, "batch": batch,
        "layer_weights_mb": round(sum(m.numel() for layer in mats for m in layer) * 4 / 2**20, 1),
        "threads": torch.get_num_threads(),
        "mkl_ms": round(t_mkl * 1e3, 3), "onednn_ms": round(t_dnn * 1e3, 3),
        "mkl_gflops": round(flops / t_mkl / 1e9, 1), "onednn_gflops": round(flops / t_dnn / 1e9, 1),
        "speedup": round(t_mkl / t_dnn, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="qwen2-tiny,qwen2-4l-256,qwen2-25m")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch default")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with torch.inference_mode():
        for preset in args.presets.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                print(json.dumps(bench(preset, batch, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
