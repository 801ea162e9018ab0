"""Calibration of the "any-hardware" proof profile across every precision and engine (issue #26).

Honest chunks: `meshrl.toploc.matrix` (CPU engine float32; reference backend float32,
bfloat16, float16; sdpa / eager; batch 1-64; every final-chunk length 1..32; hidden sizes 64
and 128), each checked by three float32 validators and three in the worker's dtype (batch 1-64,
left / right padding, sdpa / eager): ~12,000 chunks. One JSON line per (hidden size, worker):
chunks, small chunks, files, files rejected and the largest honest value / threshold of every
test; per chunk-token class (1, 2-3, 4-7, 8-15, 16-31, 32 tokens; small or not) the largest
statistics; then the thresholds fitted on it (`calibrate_thresholds`) beside the defaults; then
one line per (hidden, cheat, cheating worker): files rejected of files (files of 16
completions of 65-96 tokens) and the weakest file's largest statistic / threshold. Exit status
1 if an honest file is rejected, an honest statistic exceeds 70% of its threshold, or a cheat
file passes.

    PYTHONPATH=src python benchmarks/bench_calibration.py   # ~12,000 chunks
    PYTHONPATH=src python benchmarks/bench_calibration.py --prompts 32 --hidden 64  # quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any

import torch

from meshrl.toploc import HEADROOM, Thresholds, calibrate_thresholds, threshold_ratios, verdict
from meshrl.toploc.matrix import MATRIX_VALIDATORS, MATRIX_WORKERS, cheats, judge, prove, tiny_model
from meshrl.toploc.thresholds import is_small

CLASSES = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 32))


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (int(torch.randint(3, 12, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def _files(rollouts: list[list[Any]], rows: int) -> list[list[Any]]:
    return [[c for ro in rollouts[i:i + rows] for c in ro] for i in range(0, len(rollouts), rows)]


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--cheat-hidden", type=int, nargs="+", default=[128, 256],
                    help="hidden sizes of the cheat table (at 64, int8 weights in float32 "
                    "move the hidden states less than honest bfloat16 compute does)")
    ap.add_argument("--prompts", type=int, default=112, help="completions per worker setup")
    ap.add_argument("--file-rows", type=int, default=16, help="completions per rollout file")
    ap.add_argument("--cheat-prompts", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    th = Thresholds()
    chunk_len = 32
    lengths = [1 + i % (2 * chunk_len) for i in range(args.prompts)]
    honest: list[list[Any]] = []  # rollouts (chunk lists) of every pair
    files: list[list[Any]] = []
    per_class: dict[tuple[int, int, int], list[Any]] = defaultdict(list)
    bad = 0
    for hidden in args.hidden:
        model = tiny_model(hidden)
        vocab = model.config.vocab_size
        prompts = _prompts(args.prompts, vocab, hidden)
        for w in MATRIX_WORKERS:
            work = prove(model, w, prompts, lengths, seed=hidden)
            ros: list[list[Any]] = []
            for v in MATRIX_VALIDATORS:
                ros += judge(model, v, w.dtype, prompts, work)
            fs = _files(ros, args.file_rows)
            rejected = sum(not verdict(f, th).accepted for f in fs)
            bad += rejected
            for ro, n in zip(ros, lengths * (len(ros) // len(lengths)), strict=True):
                for j, c in enumerate(ro):
                    tok = chunk_len if j < len(ro) - 1 or n % chunk_len == 0 else n % chunk_len
                    cls = next(i for i, (lo, hi) in enumerate(CLASSES) if lo <= tok <= hi)
                    per_class[(hidden, cls, is_small(c, th))].append(c)
            honest += ros
            files += fs
            ratios = threshold_ratios(fs, th)
            _emit({"hidden": hidden, "worker": w.name, "chunks": sum(map(len, ros)),
                   "small_chunks": sum(is_small(c, th) for ro in ros for c in ro),
                   "files": len(fs), "files_rejected": rejected,
                   "worst": round(max(ratios.values()), 3),
                   "ratios": {k: round(r, 3) for k, r in ratios.items()},
                   "s": round(time.time() - t0, 1)})
    for (hidden, cls, small), cs in sorted(per_class.items()):
        lo, hi = CLASSES[cls]
        _emit({"hidden": hidden, "tokens": f"{lo}-{hi}", "small": small, "chunks": len(cs),
               "exp_mismatches": max(c.exp_mismatches for c in cs),
               "exp_rate": round(max(c.exp_mismatches / max(1, c.n_compared) for c in cs), 3),
               "mant_err_mean": round(max(c.mant_err_mean for c in cs), 3),
               "mant_err_median": max(c.mant_err_median for c in cs),
               "sign_mismatches": max(c.sign_mismatches for c in cs)})
    fitted = calibrate_thresholds(files, small_chunk_ratio=th.small_chunk_ratio,
                                  min_pooled_chunks=1)
    ratios = threshold_ratios(files, th)
    worst = max(ratios.values())
    _emit({"honest_chunks": sum(map(len, honest)), "honest_files": len(files),
           "files_rejected": bad, "worst_ratio": round(worst, 3), "headroom": HEADROOM,
           "ratios": {k: round(r, 3) for k, r in ratios.items()},
           "fitted": {k: v for k, v in fitted.model_dump().items()
                      if k.startswith(("max_", "small_"))},
           "default": {k: v for k, v in th.model_dump().items()
                       if k.startswith(("max_", "small_"))},
           "s": round(time.time() - t0, 1)})
    missed = 0
    for hidden in args.cheat_hidden:
        model = tiny_model(hidden)
        prompts = _prompts(args.cheat_prompts, model.config.vocab_size, 1000 + hidden)
        cl = [2 * chunk_len + 1 + i % chunk_len for i in range(args.cheat_prompts)]
        for cheat in cheats(hidden):
            bad_model = cheat.change(model)
            for w in (MATRIX_WORKERS[0], MATRIX_WORKERS[2]):
                work = prove(bad_model, w, prompts, cl, seed=7)
                ros = judge(model, MATRIX_VALIDATORS[0], w.dtype, prompts, work)
                fs = _files(ros, args.file_rows)
                caught = sum(not verdict(f, th).accepted for f in fs)
                missed += len(fs) - caught
                weakest = min(max(threshold_ratios([f], th).values()) for f in fs)
                _emit({"hidden": hidden, "cheat": cheat.name, "worker": w.name,
                       "files": len(fs), "files_rejected": caught,
                       "weakest": round(weakest, 3), "s": round(time.time() - t0, 1)})
    ok = bad == 0 and worst <= HEADROOM and missed == 0
    _emit({"ok": ok, "honest_files_rejected": bad, "worst_ratio": round(worst, 3),
           "cheat_files_missed": missed, "s": round(time.time() - t0, 1)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
