"""Bytes per policy version with LoRA: an adapter version vs the full checkpoint, and the cost of
the bit-exact merge a worker or validator runs to rebuild the weights.

The policy is the 25M preset (`qwen2-25m`, the character tokenizer's vocabulary) with the
trainer's default adapters (`LoraConfig`: rank 8, alpha 16, every attention and MLP
projection), trained as the trainer trains them: AdamW on the adapters alone, on a REINFORCE
loss with random +-1 advantages over random sequences. After every step the version is written
as the trainer publishes it (`LoraPolicy.save_version`: peft's adapter files + effective.json),
then rebuilt by a receiver (`shardcast.adapter.materialize` onto the base) and its weights'
hash checked against the stated one. One JSON line per step: `ratio` = adapter version bytes /
full checkpoint bytes, `merge_s_per_mb` = receiver seconds (merge + write) per MB of
checkpoint, `state_s` = the trainer's cost of stating the hash; then a summary with the goal
(ratio <= 0.05).

    PYTHONPATH=src python benchmarks/bench_adapter_bytes.py [--steps 4] [--rank 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.rl.config import LoraConfig
from meshrl.rl.lora import LoraPolicy
from meshrl.shardcast.adapter import materialize


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2-25m")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rank", type=int, default=LoraConfig().rank)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = CharTokenizer()
    model = build_model(args.preset, tok.vocab_size, seed=0)
    params = sum(p.numel() for p in model.parameters())
    ratios, merges = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_model(model, tok, root / "base")
        full = _dir_bytes(root / "base")
        lora = LoraPolicy(model, root / "base", LoraConfig(enabled=True, rank=args.rank))
        trainable = [p for p in lora.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=args.lr, betas=(0.9, 0.99))
        gen = torch.Generator().manual_seed(1)
        for step in range(1, args.steps + 1):
            lora.model.train()
            ids = torch.randint(0, tok.vocab_size, (8, 64), generator=gen)
            adv = torch.randint(0, 2, (8, 1), generator=gen).float() * 2 - 1
            logits = lora.model(input_ids=ids).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(adv * lp).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            lora.model.eval()
            version = root / f"v{step}"
            t0 = time.perf_counter()
            stated = lora.save_version(version)
            state_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            rebuilt = materialize(version, root / "base", root / f"rebuilt{step}")
            merge_s = time.perf_counter() - t0
            assert rebuilt == stated, "the receiver's weights are not the trainer's"
            size = _dir_bytes(version)
            ratios.append(size / full)
            merges.append(merge_s / (full / 1e6))
            print(json.dumps({"bench": "adapter_bytes", "step": step, "adapter_bytes": size,
                              "full_bytes": full, "ratio": round(size / full, 5),
                              "merge_s_per_mb": round(merge_s / (full / 1e6), 5),
                              "state_s": round(state_s, 3), "bit_exact": True}), flush=True)
            for p in (root / f"rebuilt{step}").iterdir():
                if p.is_file():
                    p.unlink()
    print(json.dumps({
        "bench": "adapter_bytes", "summary": True, "preset": args.preset, "params": params,
        "trainable_params": sum(p.numel() for p in trainable), "rank": args.rank,
        "ratio": round(statistics.mean(ratios), 5), "goal_ratio_max": 0.05,
        "goal_met": max(ratios) <= 0.05,
        "merge_s_per_mb": round(statistics.median(merges), 5),
        "machine": f"{os.cpu_count()} cores; the merge is elementwise numpy (no BLAS, one "
                   "thread), rank passes over each target matrix"}), flush=True)


if __name__ == "__main__":
    main()
