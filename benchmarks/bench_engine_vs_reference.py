"""The engine against the reference backend on a HF model (e.g. SmolLM2): same tokens, log-probs.

For greedy, T 1 and T 0.7 / top-p 0.9 on the same chat-template prompts as bench_inference.py:
how many rows are equal token for token, the largest log-prob difference on equal rows, and for
each differing row its first differing position and the reference's score gap there (a near
tie is float32 noise; a large gap a bug). One JSON line per mode.

    python benchmarks/bench_engine_vs_reference.py --model-dir /work/smollm2-hf [--batch 32]
        [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from bench_inference import chat_prompts
from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.inference.reference import ReferenceBackend
from meshrl.inference.sampling import gumbel_noise
from meshrl.model import load_model, load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model_dir), load_tokenizer(args.model_dir)
    engine = CPUEngine(model, tok, EngineConfig(max_batch_size=args.batch))
    ref = ReferenceBackend(model, tok)
    prompts = chat_prompts(tok, args.batch, torch.Generator().manual_seed(args.batch))
    for temp, top_p in ((0.0, 1.0), (1.0, 1.0), (0.7, 0.9)):
        p = SamplingParams(max_new_tokens=args.new_tokens, temperature=temp, top_p=top_p, seed=1)
        got, want = engine.generate(prompts, p), ref.generate(prompts, p)
        equal = [a.token_ids == b.token_ids for a, b in zip(got, want, strict=True)]
        lp = max((abs(x - y) for a, b, e in zip(got, want, equal, strict=True) if e
                  for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
        differ = []
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a.token_ids == b.token_ids:
                continue
            n = min(len(a.token_ids), len(b.token_ids))
            j = next((k for k in range(n) if a.token_ids[k] != b.token_ids[k]), n)
            gap = None
            if j < n:
                lg = ref.score([prompts[i]], [b.token_ids[: j + 1]],
                               return_logits=True)[0].logits[j].double()
                if temp > 0:
                    lg = lg / temp + gumbel_noise(1, [i], [j], lg.shape[0])[0]
                gap = round(float(lg[b.token_ids[j]] - lg[a.token_ids[j]]), 6)
            differ.append({"row": i, "position": j, "reference_score_gap": gap})
        print(json.dumps({"bench": "engine_vs_reference", "model": Path(args.model_dir).name,
                          "temperature": temp, "top_p": top_p, "rows": len(prompts),
                          "rows_equal": sum(equal), "max_logprob_diff": lp, "differ": differ}),
              flush=True)


if __name__ == "__main__":
    main()
