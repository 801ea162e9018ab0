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

`--model-dir DIR` (issue #40) runs the matrix on a real model instead (SmolLM2-135M-Instruct:
hidden 576, 30 layers): chat-template arithmetic prompts, 4 worker setups (CPU engine float32;
reference bfloat16 sdpa / eager, float16) x 4 validators (float32 and the worker's dtype),
completions of 1-128 tokens in files of 16 mixed lengths, then the cheats of
`cheats(real=True)` (int8, int4, one layer x1.01 and x1.1, 1% noise, two layers swapped, a
re-initialised model) from a float32 and a bfloat16 worker. `--raw PATH` writes every chunk's
statistics as JSON lines (one per completion and pairing) to refit without regenerating.

    PYTHONPATH=src python benchmarks/bench_calibration.py \
        --model-dir runs/models/smollm2-135m-instruct --raw /tmp/cal.jsonl   # ~5,100 chunks
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from typing import Any

import torch

from meshrl.toploc import HEADROOM, Thresholds, calibrate_thresholds, threshold_ratios, verdict
from meshrl.toploc.matrix import (
    MATRIX_VALIDATORS,
    MATRIX_WORKERS,
    MatrixValidator,
    MatrixWorker,
    cheats,
    judge,
    prove,
    tiny_model,
)
from meshrl.toploc.thresholds import is_small

CLASSES = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 32))
# the real model's matrix (--model-dir): sized for ~25 min on one core
REAL_WORKERS = (
    MatrixWorker("engine-fp32-b32", "engine", "float32", 32),
    MatrixWorker("ref-bf16-b16", "reference", "bfloat16", 16),
    MatrixWorker("ref-bf16-b32-eager", "reference", "bfloat16", 32, attn="eager"),
    MatrixWorker("ref-fp16-b16", "reference", "float16", 16),
)
REAL_VALIDATORS = (
    MatrixValidator("fp32-b16", "float32", 16),
    MatrixValidator("fp32-b32-left-eager", "float32", 32, pad_left=True, attn="eager"),
    MatrixValidator("own-b16", "worker", 16),
    MatrixValidator("own-b8-left-eager", "worker", 8, pad_left=True, attn="eager"),
)


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (int(torch.randint(3, 12, (1,), generator=g)),),
                          generator=g).tolist() for _ in range(n)]


def _files(rollouts: list[list[Any]], rows: int) -> list[list[Any]]:
    return [[c for ro in rollouts[i:i + rows] for c in ro] for i in range(0, len(rollouts), rows)]


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _chat_prompts(tok: Any, n: int, seed: int) -> list[list[int]]:
    """Arithmetic questions through the tokenizer's chat template (as a pool's prompts)."""
    from meshrl.pool.assignment import encode_prompt

    g = torch.Generator().manual_seed(seed)
    ops = ("+", "-", "*")
    out = []
    for i in range(n):
        a, b, c = (int(x) for x in torch.randint(2, 99, (3,), generator=g))
        text = (f"What is {a} {ops[i % 3]} {b}?" if i % 2 else
                f"Solve step by step: ({a} {ops[i % 3]} {b}) + {c} = ?")
        out.append(encode_prompt(tok, text, "chat"))
    return out


def _raw(fh: Any, **rec: Any) -> None:
    """One completion's chunks (exp, mean, median, sign, matched, exact, values, reason)."""
    if fh is not None:
        chunks = [[c.exp_mismatches, c.mant_err_mean, c.mant_err_median, c.sign_mismatches,
                   c.n_matched, c.n_exact, c.n_values, c.reason] for c in rec.pop("ro")]
        fh.write(json.dumps({**rec, "chunks": chunks}) + "\n")


def _real_honest(model: Any, tok: Any, pairs: list[tuple[MatrixWorker, MatrixValidator]],
                 args: argparse.Namespace, th: Thresholds, fh: Any,
                 t0: float) -> tuple[int, float, int]:
    """Honest pairings on the real model: (files rejected, worst ratio, chunks)."""
    n = args.prompts
    prompts = _chat_prompts(tok, n, 0)
    lengths = [1 + i * 128 // n for i in range(n)]  # ascending: batches of like lengths
    stride = max(1, n // args.file_rows)  # file k: rows k, k + stride, ... (mixed lengths)
    order = [k + j * stride for k in range(stride) for j in range(args.file_rows)
             if k + j * stride < n]
    bad, worst, chunks = 0, 0.0, 0
    for w in dict.fromkeys(w for w, _ in pairs):
        work = prove(model, w, prompts, lengths, seed=11)
        for v in (v for ww, v in pairs if ww == w):
            ros = judge(model, v, w.dtype, prompts, work)
            for i, ro in enumerate(ros):
                _raw(fh, kind="honest", worker=w.name, dtype=w.dtype, validator=v.name,
                     row=i, tokens=lengths[i], ro=ro)
            fs = _files([ros[i] for i in order], args.file_rows)
            rejected = [r for f in fs for r in verdict(f, th).reasons[:1]]
            ratios = threshold_ratios(fs, th)
            bad += len(rejected)
            worst = max(worst, *ratios.values())
            chunks += sum(map(len, ros))
            _emit({"worker": w.name, "validator": v.name, "chunks": sum(map(len, ros)),
                   "files": len(fs), "files_rejected": len(rejected), "first": rejected[:1],
                   "ratios": {k: round(r, 3) for k, r in ratios.items()},
                   "s": round(time.time() - t0, 1)})
    return bad, worst, chunks


def _real_cheats(model: Any, tok: Any, pairs: list[tuple[MatrixWorker, MatrixValidator]],
                 args: argparse.Namespace, th: Thresholds, fh: Any, t0: float) -> int:
    """One file of `file_rows` completions of 65-96 tokens per (cheat, pair): files missed."""
    cp = _chat_prompts(tok, args.file_rows, 1)
    cl = [65 + i * 32 // args.file_rows for i in range(args.file_rows)]
    missed = 0
    for cheat in cheats(model.config.hidden_size, real=True):
        if args.cheats and cheat.name not in args.cheats:
            continue
        bad_model = cheat.change(model)
        for w in dict.fromkeys(w for w, _ in pairs):
            work = prove(bad_model, w, cp, cl, seed=7)
            for v in (v for ww, v in pairs if ww == w):
                ros = judge(model, v, w.dtype, cp, work)
                for i, ro in enumerate(ros):
                    _raw(fh, kind="cheat", cheat=cheat.name, worker=w.name, dtype=w.dtype,
                         validator=v.name, row=i, tokens=cl[i], ro=ro)
                f = [c for ro in ros for c in ro]
                vd = verdict(f, th)
                missed += vd.accepted
                _emit({"cheat": cheat.name, "worker": w.name, "validator": v.name,
                       "chunks": len(f), "rejected": not vd.accepted,
                       "ratios": {k: round(r, 3) for k, r in threshold_ratios([f], th).items()},
                       "s": round(time.time() - t0, 1)})
        del bad_model
    return missed


def _read_raw(paths: list[str]) -> list[dict[str, Any]]:
    from meshrl.toploc.proofs import ChunkResult

    out = []
    for path in paths:
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                rec["ro"] = [ChunkResult(exp_mismatches=e, mant_err_mean=m, mant_err_median=md,
                                         sign_mismatches=sg, n_matched=nm, n_exact=nx,
                                         n_values=nv, reason=r)
                             for e, m, md, sg, nm, nx, nv, r in rec.pop("chunks")]
                out.append(rec)
    return out


def rejudge(paths: list[str], layers: int, file_rows: int, profile: str = "any-hardware") -> int:
    """Judge stored chunks (`--raw` files) under proof profile `profile` widened for `layers`
    (as the validator's replay does): per honest pairing the profile is honest for, the worst
    share of every statistic; per cheat file the verdict, its strongest test (largest share of
    its bound) and the separation: that share over the honest files' largest share of the
    same test."""
    from meshrl.pool import profile as proof_profile
    from meshrl.validator.replay import profile_thresholds

    th = profile_thresholds(profile).for_depth(layers)
    dtypes = proof_profile(profile).dtypes
    recs = [r for r in _read_raw(paths) if r["dtype"] in dtypes
            and (r["validator"].startswith("fp32") or "float32" in dtypes)]
    honest: dict[tuple[str, str], dict[int, list[Any]]] = defaultdict(dict)
    bad_files: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    for r in recs:
        if r["kind"] == "honest":
            honest[(r["worker"], r["validator"])][r["row"]] = r["ro"]
        else:
            bad_files[(r["cheat"], r["worker"], r["validator"])] += r["ro"]
    worst: dict[str, float] = defaultdict(float)
    total, rejected = 0, 0
    for (w, v), rows in sorted(honest.items()):
        n = max(rows) + 1
        stride = max(1, n // file_rows)
        order = [k + j * stride for k in range(stride) for j in range(file_rows)
                 if k + j * stride < n and k + j * stride in rows]
        fs = _files([rows[i] for i in order], file_rows)
        bad = [vd.reasons[0] for vd in (verdict(f, th) for f in fs) if not vd.accepted]
        ratios = threshold_ratios(fs, th)
        for k, x in ratios.items():
            worst[k] = max(worst[k], x)
        total += sum(map(len, rows.values()))
        rejected += len(bad)
        _emit({"worker": w, "validator": v, "chunks": sum(map(len, rows.values())),
               "files": len(fs), "files_rejected": len(bad), "first": bad[:1],
               "worst": round(max(ratios.values()), 3),
               "ratios": {k: round(x, 3) for k, x in ratios.items() if x > 0}})
    honest_worst = max(worst.values(), default=0.0)
    _emit({"honest_chunks": total, "files_rejected": rejected, "depth_factor":
           round(th.depth_factor(layers), 3), "worst_ratio": round(honest_worst, 3),
           "worst": {k: round(x, 3) for k, x in worst.items() if x > 0},
           "thresholds": {k: round(x, 4) for k, x in th.model_dump().items()
                          if k.startswith("max_") and isinstance(x, float)}})
    missed = 0
    for (cheat, w, v), f in sorted(bad_files.items()):
        vd = verdict(f, th)
        missed += vd.accepted
        ratios = threshold_ratios([f], th)
        best = max(ratios, key=lambda k: ratios[k])  # the cheat's strongest test
        sep = ratios[best] / worst[best] if worst.get(best, 0) > 0 else math.inf
        _emit({"cheat": cheat, "worker": w, "validator": v, "chunks": len(f),
               "rejected": not vd.accepted, "largest_share": round(ratios[best], 3),
               "by": best, "honest_worst_share": round(worst.get(best, 0.0), 3),
               "separation": round(sep, 2), "first": vd.reasons[:1]})
    ok = rejected == 0 and honest_worst <= HEADROOM and missed == 0
    _emit({"ok": ok, "honest_files_rejected": rejected, "worst_ratio": round(honest_worst, 3),
           "cheat_files_missed": missed})
    return 0 if ok else 1


def real_main(args: argparse.Namespace) -> int:
    """The matrix and the cheats on a real model (`--model-dir`)."""
    from meshrl.model import load_model, load_tokenizer

    t0 = time.time()
    model, tok = load_model(args.model_dir).float().eval(), load_tokenizer(args.model_dir)
    th = Thresholds().for_depth(model.config.num_hidden_layers)  # as the validator's replay
    fh = open(args.raw, "w", buffering=1) if args.raw else None  # noqa: SIM115
    bad, worst, chunks, missed = 0, 0.0, 0, 0
    pairs = [(w, v) for w in REAL_WORKERS for v in REAL_VALIDATORS
             if not args.pairs or f"{w.name}:{v.name}" in args.pairs]
    cheat_pairs = [(w, v) for w in REAL_WORKERS[:2] for v in REAL_VALIDATORS[::2]
                   if (v.dtype, w.dtype) != ("worker", "float32")
                   and (not args.cheat_pairs or f"{w.name}:{v.name}" in args.cheat_pairs)]
    for part in ("cheats", "honest") if args.cheats_first else ("honest", "cheats"):
        if part == "honest":
            b, wr, c = _real_honest(model, tok, pairs, args, th, fh, t0)
            bad, worst, chunks = bad + b, max(worst, wr), chunks + c
            _emit({"honest_chunks": chunks, "files_rejected": bad,
                   "worst_ratio": round(worst, 3), "s": round(time.time() - t0, 1)})
        else:
            missed += _real_cheats(model, tok, cheat_pairs, args, th, fh, t0)
    if fh is not None:
        fh.close()
    ok = bad == 0 and worst <= HEADROOM and missed == 0
    _emit({"ok": ok, "honest_chunks": chunks, "honest_files_rejected": bad,
           "worst_ratio": round(worst, 3), "cheat_files_missed": missed,
           "s": round(time.time() - t0, 1)})
    return 0 if ok else 1


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
    ap.add_argument("--model-dir", default="", help="a real model's HF directory (issue #40)")
    ap.add_argument("--raw", default="", help="--model-dir: JSON lines of every chunk here")
    ap.add_argument("--pairs", nargs="*", default=[], help="--model-dir: only these honest "
                    "WORKER:VALIDATOR pairings (names of REAL_WORKERS / REAL_VALIDATORS)")
    ap.add_argument("--cheat-pairs", nargs="*", default=[], help="--model-dir: likewise for "
                    "the cheats (workers engine-fp32-b32 / ref-bf16-b16)")
    ap.add_argument("--cheats", nargs="*", default=[], help="--model-dir: only these cheats")
    ap.add_argument("--cheats-first", action="store_true")
    ap.add_argument("--rejudge", nargs="*", default=[], help="judge these --raw files again "
                    "(under the thresholds for --layers) instead of generating")
    ap.add_argument("--profile", default="any-hardware", help="--rejudge: the proof profile")
    ap.add_argument("--layers", type=int, default=0, help="--rejudge: the model's depth "
                    "(default: --model-dir's config)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.rejudge:
        from meshrl.model.families import read_model_config

        layers = args.layers or read_model_config(args.model_dir)["num_hidden_layers"]
        return rejudge(args.rejudge, layers, args.file_rows, args.profile)
    if args.model_dir:
        if args.prompts == 112:  # the tiny default: the real model's is 128 (5,120 chunks)
            args.prompts = 128
        return real_main(args)
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
