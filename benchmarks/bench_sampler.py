"""The engine's seeded sampler against its definition, per decode step, at a real vocabulary size.

The definition (docs/sampling.md): noise from the torch int64 hash over [B, V], the nucleus from
a full sort of every row. The engine: `BatchSampler(native=...)` (one native pass for the
hashes) and `top_p_mask` from candidates. Both pick the same tokens (checked on every row);
`speedup` = definition time / engine time, measured alternately in one process. Logits are
SmolLM2's own (a batch of chat prompts and their sampled completions, scored) with
`--model-dir`, else peaked synthetic rows of `--vocab` tokens.

    python benchmarks/bench_sampler.py [--model-dir /work/smollm2-hf] [--batches 32,64]
        [--temperatures 0.7,1.0] [--top-ps 1.0,0.9] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.inference.native import NativeKernels
from meshrl.inference.sampling import BatchSampler, _nucleus_by_sort, gumbel_noise


def real_logits(model_dir: str, rows: int) -> torch.Tensor:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_inference import chat_prompts

    engine = CPUEngine.from_pretrained(model_dir, EngineConfig(max_batch_size=16))
    prompts = chat_prompts(engine.tokenizer, 16, torch.Generator().manual_seed(0))
    per = -(-rows // 16)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=per, temperature=1.0, seed=3,
                                                   ignore_eos=True))
    scored = engine.score(prompts, outs, return_hidden_states=False, return_logits=True)
    return torch.cat([s.logits for s in scored])[:rows]


def synthetic_logits(rows: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 2
    logits[:, :8] += torch.linspace(14, 8, 8)
    return logits


def definition(logits, seed, seq, position, temperature, top_p) -> torch.Tensor:
    scaled = logits.double() / temperature
    scores = scaled + gumbel_noise(seed, seq, [position] * len(seq), logits.shape[-1])
    if top_p < 1.0:
        scores = scores.masked_fill(~_nucleus_by_sort(torch.softmax(scaled.float(), -1), top_p),
                                    float("-inf"))
    return scores.argmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--batches", default="32,64")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--top-ps", default="1.0,0.9")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    pool = real_logits(args.model_dir, max(batches)) if args.model_dir \
        else synthetic_logits(max(batches), args.vocab)
    kernels = NativeKernels.load()
    for b in batches:
        logits, seq = pool[:b].contiguous(), list(range(b))
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for top_p in (float(p) for p in args.top_ps.split(",")):
                fast = BatchSampler(5, seq, logits.shape[1], temperature, top_p, native=kernels)
                best = {"definition": float("inf"), "engine": float("inf")}
                same = True
                for r in range(args.repeats):
                    for name in best:
                        t0 = time.perf_counter()
                        tok = definition(logits, 5, seq, r, temperature, top_p) \
                            if name == "definition" else fast.sample(logits, r)
                        best[name] = min(best[name], time.perf_counter() - t0)
                        if name == "definition":
                            want = tok
                        else:
                            same &= torch.equal(tok, want)
                print(json.dumps({
                    "bench": "sampler", "logits": "model" if args.model_dir else "synthetic",
                    "batch": b, "vocab": logits.shape[1], "temperature": temperature,
                    "top_p": top_p, "definition_ms": round(best["definition"] * 1e3, 2),
                    "engine_ms": round(best["engine"] * 1e3, 2),
                    "speedup": round(best["definition"] / best["engine"], 2),
                    "same_tokens": same, "threads": torch.get_num_threads(),
                }), flush=True)


if __name__ == "__main__":
    main()
