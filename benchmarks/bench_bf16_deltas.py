"""Bytes per bfloat16 policy version (issue #40): the sparse value delta against the previous
bfloat16 version vs the full bfloat16 checkpoint, at RL learning rates.

The policy is trained as the trainer trains it (AdamW with `TrainerConfig`'s betas (0.9, 0.99),
eps 1e-8, weight decay 0, gradient norm clipped at 1), on the cross-entropy of a small batch of
chat-formatted arithmetic samples (real text tokens), starting again from the same weights for
each learning rate. After every step the float32 master is saved as `network.publish_dtype =
"bfloat16"` publishes it (`save_model(dtype=torch.bfloat16)`) and its weights file is diffed
against the previous version's with `shardcast.delta.encode_delta` (the sparse value codec, or
the file-level one when that is smaller) and rebuilt (`decode_delta`, hash-checked). One JSON
line per step: `changed_fraction` (of the bfloat16 values), `delta_bytes`, `full_bytes`,
`ratio` = delta / full, `codec`, `encode_s`, `decode_s`, `bit_exact`; then one summary line per
learning rate.

    PYTHONPATH=src python benchmarks/bench_bf16_deltas.py            # a tiny Llama, anywhere
    PYTHONPATH=src python benchmarks/bench_bf16_deltas.py --model /work/smollm2-hf \\
        --lrs 1e-6,3e-6,1e-5,3e-4 --steps 3 --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshrl.model import CharTokenizer, build_model, load_model, save_model
from meshrl.rl.config import TrainerConfig
from meshrl.shardcast.delta import decode_delta, encode_delta
from meshrl.shardcast.sparse import MAGIC, bf16_layout


def _samples(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        out.append((f"What is {a} + {b}? Answer with the number only.", str(a + b)))
    return out


def _batch(tokenizer: Any, n: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels (-100 on padding) of `n` chat-formatted samples, `seq` long."""
    rows = []
    for q, a in _samples(n, seed):
        if hasattr(tokenizer, "apply_chat_template"):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer.encode(f"{q} {a}")
        rows.append(ids[:seq])
    ids = torch.zeros(n, seq, dtype=torch.long)
    labels = torch.full((n, seq), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        labels[i, :len(r)] = torch.tensor(r)
    return ids, labels


def _changed(t: bytes, b: bytes) -> float:
    start = bf16_layout(t)[0]  # type: ignore[index]
    return float((np.frombuffer(t, "<u2", offset=start)
                  != np.frombuffer(b, "<u2", offset=start)).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="a float32 HF model directory (default: the "
                    "llama-tiny preset with random weights)")
    ap.add_argument("--lrs", default=f"1e-6,3e-6,1e-5,{TrainerConfig().lr}")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per learning rate")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = TrainerConfig()
    if args.model:
        from transformers import AutoTokenizer

        model, name = load_model(args.model), Path(args.model).name
        tokenizer: Any = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    else:
        tokenizer, name = CharTokenizer(), "llama-tiny"
        model = build_model("llama-tiny", tokenizer.vocab_size, seed=0)
    pristine = {k: v.clone() for k, v in model.state_dict().items()}
    root = Path(tempfile.mkdtemp(prefix="bench-bf16-"))
    try:
        for lr in (float(x) for x in args.lrs.split(",")):
            model.load_state_dict(pristine)
            opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=cfg.betas, eps=1e-8,
                                    weight_decay=cfg.weight_decay)
            prev = (save_model(model, None, root / "v0", dtype=torch.bfloat16)
                    / "model.safetensors").read_bytes()
            rows = []
            for step in range(1, args.steps + 1):
                ids, labels = _batch(tokenizer, args.batch, args.seq, seed=step)
                model.train()
                loss = model(input_ids=ids, labels=labels).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                opt.step()
                model.eval()
                cur = (save_model(model, None, root / f"v{step}", dtype=torch.bfloat16)
                       / "model.safetensors").read_bytes()
                t0 = time.perf_counter()
                delta = encode_delta(cur, prev)
                enc = time.perf_counter() - t0
                sha = hashlib.sha256(cur).hexdigest()
                t0 = time.perf_counter()
                exact = decode_delta(delta, prev, len(cur), sha) == cur
                dec = time.perf_counter() - t0
                row = {"bench": "bf16_delta", "model": name, "lr": lr, "step": step,
                       "loss": round(loss.item(), 4),
                       "changed_fraction": round(_changed(cur, prev), 5),
                       "delta_bytes": len(delta), "full_bytes": len(cur),
                       "ratio": round(len(delta) / len(cur), 4),
                       "codec": "sparse" if delta[:10] == MAGIC else "words",
                       "encode_s": round(enc, 3), "decode_s": round(dec, 3), "bit_exact": exact}
                rows.append(row)
                print(json.dumps(row), flush=True)
                shutil.rmtree((root / f"v{step - 1}").resolve(), ignore_errors=True)
                prev = cur
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            print(json.dumps({
                "bench": "bf16_delta_summary", "model": name, "lr": lr, "steps": args.steps,
                "changed_fraction": round(statistics.median(r["changed_fraction"]
                                                            for r in rows), 5),
                "ratio": round(statistics.median(r["ratio"] for r in rows), 4),
                "ratio_max": max(r["ratio"] for r in rows),
                "bit_exact": all(r["bit_exact"] for r in rows)}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
