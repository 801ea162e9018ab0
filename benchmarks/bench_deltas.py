"""Bytes per policy version: a lossless delta against the previous version vs the full checkpoint.

The policy is the 25M preset (`qwen2-25m`, the character tokenizer's vocabulary), trained as the
trainer trains it: AdamW with the trainer's defaults (`TrainerConfig`: lr 3e-4 after a 5-step
linear warm-up, betas (0.9, 0.99), gradient norm clipped at 1), on a REINFORCE loss with random
+-1 advantages over random sequences (gradients as noisy as RL's). After every step the model is
saved as the trainer publishes it (`save_model`: HF layout, safetensors float32) and diffed
against the previous save with `shardcast.delta` (`make_delta_dir`, what `network.broadcast =
"delta"` publishes); the delta is rebuilt on the previous version (`reconstruct`) and checked
bit-exact. One JSON line per step: `ratio` = delta bytes / full bytes of the model directory,
`encode_s_per_mb` / `decode_s_per_mb` = codec seconds per MB of checkpoint; then a summary.

    PYTHONPATH=src python benchmarks/bench_deltas.py [--steps 8] [--lr 3e-4] [--preset qwen2-25m]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.rl.config import TrainerConfig
from meshrl.rl.trainer import lr_factor
from meshrl.shardcast.delta import make_delta_dir, reconstruct
from meshrl.shardcast.manifest import FULL_DIR, build_manifest, sha256_file


def _step(model, opt, sched, cfg: TrainerConfig, vocab: int, gen: torch.Generator) -> float:
    model.train()
    ids = torch.randint(0, vocab, (8, 64), generator=gen)
    adv = torch.randint(0, 2, (8, 1), generator=gen).float() * 2 - 1
    logits = model(input_ids=ids).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(adv * lp).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    lr = sched.get_last_lr()[0]
    opt.step()
    sched.step()
    model.eval()
    return lr


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2-25m")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=TrainerConfig().lr)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = TrainerConfig(lr=args.lr)
    tok = CharTokenizer()
    model = build_model(args.preset, tok.vocab_size, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg, s, args.steps))
    gen = torch.Generator().manual_seed(0)
    root = Path(tempfile.mkdtemp(prefix="bench-deltas-"))
    ratios = []
    try:
        prev = save_model(model, tok, root / "v0")
        for step in range(1, args.steps + 1):
            lr = _step(model, opt, sched, cfg, tok.vocab_size, gen)
            cur = save_model(model, tok, root / f"v{step}")
            stage = root / f"d{step}"
            t0 = time.perf_counter()
            delta_bytes = make_delta_dir(cur, prev, stage)
            enc = time.perf_counter() - t0
            full = _dir_bytes(cur)
            m = build_manifest(stage, step, 1 << 20)  # the version's manifest, unsigned
            t0 = time.perf_counter()
            reconstruct(m, stage, prev, root / f"r{step}")
            dec = time.perf_counter() - t0
            exact = all(sha256_file(root / f"r{step}" / m.files[i].name.removeprefix("full/"))
                        == m.files[i].sha256 for i in m.part(FULL_DIR))
            ratio = delta_bytes / full
            ratios.append(ratio)
            print(json.dumps({"bench": "delta", "preset": args.preset, "step": step,
                              "lr": lr, "full_bytes": full, "delta_bytes": delta_bytes,
                              "ratio": round(ratio, 4), "bit_exact": exact,
                              "encode_s_per_mb": round(enc / (full / 1e6), 5),
                              "decode_s_per_mb": round(dec / (full / 1e6), 5)}), flush=True)
            for d in (stage, root / f"r{step}"):
                shutil.rmtree(d)
            shutil.rmtree(prev.resolve(), ignore_errors=True)
            prev = cur
        print(json.dumps({"bench": "delta_summary", "preset": args.preset, "steps": args.steps,
                          "ratio": round(statistics.median(ratios), 4),
                          "ratio_max": round(max(ratios), 4),
                          "ratio_after_warmup": round(statistics.median(
                              ratios[cfg.warmup_steps:] or ratios), 4)}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
