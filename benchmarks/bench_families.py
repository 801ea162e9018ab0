"""The fast engine vs the reference backend on the families a pool may bring (Qwen2.5, Qwen3,
Llama 3; `tests/hf_families.py`'s real config keys at a chosen width), same prompts and seed.

For each family: sampled generation of `--new-tokens` tokens (EOS ignored) for `--batch`
prompts by both backends, best of `--repeats`; one JSON object per line with tokens/s of each,
`speedup` = engine / reference, and whether the tokens agree (they must: the engine is checked
against the reference token for token).

    python benchmarks/bench_families.py [--hidden 256] [--layers 4] [--batch 16]
        [--new-tokens 64] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch

from hf_families import FAMILY_CONFIGS, bpe_tokenizer
from meshrl.inference import CPUEngine, EngineConfig, ReferenceBackend, SamplingParams


def _model(name: str, vocab: int, hidden: int, layers: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(FAMILY_CONFIGS[name])
    heads = max(4, hidden // 64)
    data.update(hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=1 if "mqa" in name else max(1, heads // 2))
    if "head_dim" in data:
        data["head_dim"] = hidden // heads
    config = AutoConfig.for_model(data.pop("model_type"), vocab_size=vocab, **data)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval()


def _best(fn, repeats: int) -> tuple[float, list]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = bpe_tokenizer()
    vocab = len(tok)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(8, 24, (a.batch,), generator=g)]
    params = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0, seed=3,
                            ignore_eos=True)
    for name in sorted(FAMILY_CONFIGS):
        model = _model(name, vocab, a.hidden, a.layers)
        engine, ref = CPUEngine(model, None, EngineConfig()), ReferenceBackend(model)
        t_e, out_e = _best(lambda e=engine: e.generate(prompts, params), a.repeats)
        t_r, out_r = _best(lambda r=ref: r.generate(prompts, params), a.repeats)
        n = sum(len(c.token_ids) for c in out_e)
        print(json.dumps({
            "family": name, "hidden": a.hidden, "layers": a.layers, "batch": a.batch,
            "new_tokens": a.new_tokens, "threads": a.threads,
            "engine_tok_s": round(n / t_e, 1), "reference_tok_s": round(n / t_r, 1),
            "speedup": round(t_r / t_e, 2),
            "tokens_agree": all(x.token_ids == y.token_ids
                                for x, y in zip(out_e, out_r, strict=True)),
        }), flush=True)


if __name__ == "__main__":
    main()
