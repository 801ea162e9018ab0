"""Honest margin of every replay tolerance: honest files from every CPU engine and precision,
judged by the validator's real checks (`meshrl.validator.verify.verify_files`).

Workers (the tiny preset model, random init): the CPU engine with its native decode kernels
(1 thread) and with the torch decode step (2 threads, batch 3), both float32; the reference
backend in float32 and in bfloat16 (batch 8). Validators: the CPU engine as `meshrl validator`
loads it, 1 thread, or 2 threads with batch 7 (alternating). File shapes from 2 to 32 TOPLOC
chunks, top_p 1.0 and 0.9, EOS allowed. Each file is judged under every proof profile it is
honest for (float32: both; bfloat16: `any-hardware` only). One JSON line per (worker, top_p,
profile): files, accepted, and per statistic the honest max / its threshold (`margin`) and the
p99 of the per-file maxima over the threshold (`p99`); then the exploit lines: how many tokens
a cheater can choose inside each sampling tolerance, and how often weight cheats (int8, one
layer x1.1) are rejected by chunk count. Exit status 1 if any honest file is invalidated.

    PYTHONPATH=src python benchmarks/bench_honest_margin.py            # 240 files, ~3 min
    PYTHONPATH=src python benchmarks/bench_honest_margin.py --counters 1 --no-exploits  # quick
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from meshrl.inference import (
    CPUEngine,
    EngineConfig,
    InferenceBackend,
    ReferenceBackend,
    ReferenceConfig,
)
from meshrl.inference.sampling import gumbel_noise
from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer
from meshrl.pool import Assignment, PoolRules
from meshrl.tasks import ArithmeticConfig, TasksConfig
from meshrl.toploc.perturb import quantize_weights, scale_layer_mlp
from meshrl.validator.replay import ReplayConfig, model_layers, profile_thresholds
from meshrl.validator.verify import ChainClaim, verify_files
from meshrl.wire.rollout_file import RolloutFile, read_rollout_file, rollout_file_bytes
from meshrl.worker.rollouts import generate_rollouts

NODE, PROVIDER = "0x" + "ab" * 20, "0x" + "cd" * 20
TASKS = TasksConfig(mix=[ArithmeticConfig(digits=2, operators="+-")])
PROFILES = ("meshrl-cpu-engine", "any-hardware")

Factory = Callable[[Any, Any], InferenceBackend]
# name -> (compute dtype, backend factory from (fp32 model, tokenizer))
WORKERS: dict[str, tuple[str, Factory]] = {
    "engine-native-t1": ("float32", lambda m, t: CPUEngine(m, t, EngineConfig(num_threads=1))),
    "engine-torch-t2-b3": ("float32", lambda m, t: CPUEngine(m, t, EngineConfig(
        num_threads=2, max_batch_size=3, decode_kernels="torch"))),
    "reference-fp32-b8": ("float32", lambda m, t: ReferenceBackend(
        copy.deepcopy(m).float(), t, ReferenceConfig(max_batch_size=8))),
    "reference-bf16-b8": ("bfloat16", lambda m, t: ReferenceBackend(
        copy.deepcopy(m).to(torch.bfloat16), t, ReferenceConfig(max_batch_size=8))),
}
VALIDATORS = (EngineConfig(num_threads=1), EngineConfig(num_threads=2, max_batch_size=7))
# validators in another dtype (`--validator-dtypes`, issue #40): the reference backend, as a
# GPU validator runs it, in two batch sizes (alternating)
OTHER_VALIDATORS: dict[str, tuple[Factory, Factory]] = {
    dt: (lambda m, t, dt=dt: ReferenceBackend(copy.deepcopy(m).to(getattr(torch, dt)), t,
                                             ReferenceConfig(max_batch_size=16)),
         lambda m, t, dt=dt: ReferenceBackend(copy.deepcopy(m).to(getattr(torch, dt)), t,
                                             ReferenceConfig(max_batch_size=5,
                                                             score_padding="left")))
    for dt in ("bfloat16", "float16")
}
# (max_new_tokens, prompts per file, group size): 2 to 32 chunks of 32 tokens per file
SHAPES = ((8, 2, 4), (16, 1, 2), (32, 4, 4), (64, 2, 4), (100, 1, 2))
TOP_PS = (1.0, 0.9)


def make_rules(max_new: int, prompts: int, group: int, top_p: float = 1.0,
               ignore_eos: bool = False, prompt_format: str = "raw") -> PoolRules:
    return PoolRules(pool_id=1, seed=7, async_level=2, prompts_per_file=prompts,
                     group_size=group, task=TASKS, prompt_format=prompt_format,
                     sampling={"max_new_tokens": max_new, "temperature": 1.0, "top_p": top_p,
                               "ignore_eos": ignore_eos})


def make_file(engine: InferenceBackend, tok: Any, rules: PoolRules, counter: int) -> RolloutFile:
    """A worker's file of (NODE, step 0, counter) at policy version 0 (a file's step is its
    version; the engines hold version 0), as a validator downloads and reads it."""
    rf = generate_rollouts(engine, tok, Assignment(rules, NODE, counter, 0),
                           rules.task.build(), PROVIDER)
    return read_rollout_file(rollout_file_bytes(rf))


def claim_of(rf: RolloutFile) -> ChainClaim:
    return ChainClaim("00" * 32, rf.header.node, rf.header.provider, rf.header.work_units)


def file_ratios(stats: dict[str, Any], cfg: ReplayConfig, top_p: float,
                layers: int | None = None) -> dict[str, float]:
    """Every thresholded statistic of one judged file over its threshold (1.0 = at it), the
    thresholds widened for a model of `layers` layers as the replay widens them."""
    th = cfg.thresholds.for_depth(layers)
    out = {"sampling_margin": stats["max_sampling_margin"] / cfg.sampling_tolerance,
           "logprob_diff": stats["max_logprob_diff"] / cfg.logprob_atol,
           "logprob_bias": abs(stats["logprob_bias"]) / stats["logprob_bias_limit"],
           "logprob_abs_mean": stats["logprob_abs_mean"] / stats["logprob_abs_limit"],
           "chunk_exp_mismatches": stats["max_exp_mismatches"] / th.max_exp_mismatches,
           "chunk_mant_err_mean": stats["max_mant_err_mean"] / th.max_mant_err_mean,
           "chunk_mant_err_median": stats["max_mant_err_median"] / th.max_mant_err_median,
           "inexact_tokens": stats["inexact_tokens"] / stats["inexact_limit"]}
    if top_p < 1.0:
        out["top_p_excess"] = (stats["max_top_p_excess"] / th.top_p_slack if th.top_p_slack
                               else float(stats["max_top_p_excess"] > 0))
    for k, limit in stats["pooled_limits"].items():
        out[f"pooled_{k}"] = stats["pooled"][k] / limit
    return out


def judge(validator: InferenceBackend, tok: Any, files: list[tuple[RolloutFile, PoolRules]],
          profile: str) -> list[tuple[bool, str, dict[str, float]]]:
    """(accepted, reason, ratios) of every file under `profile`, judged file by file's rules."""
    cfg = ReplayConfig(thresholds=profile_thresholds(profile))
    out = []
    for rf, rules in files:
        d = verify_files(validator, tok, [(rf, claim_of(rf))], rules, rules.task.build(), cfg)[0]
        ratios = (file_ratios(d.stats, cfg, rules.sampling.top_p, model_layers(validator))
                  if d.stats else {})
        out.append((d.accepted, d.reason, ratios))
    return out


def honest_configs(model: Any, tok: Any, counters: int, workers: list[str],
                   log: Callable[[str], None], prompt_format: str = "raw",
                   validator_dtypes: tuple[str, ...] = ("float32",)) -> list[dict[str, Any]]:
    """One record per (worker, top_p, validator dtype, profile): files, accepted, margin and
    p99 per statistic. Float32 validators are the CPU engine (`VALIDATORS`), others the
    reference backend in that dtype (`OTHER_VALIDATORS`)."""
    validators = {dt: [CPUEngine(model, tok, c) for c in VALIDATORS] if dt == "float32"
                  else [f(model, tok) for f in OTHER_VALIDATORS[dt]] for dt in validator_dtypes}
    lines = []
    for name, top_p in itertools.product(workers, TOP_PS):
        dtype, factory = WORKERS[name]
        worker = factory(model, tok)
        t0 = time.perf_counter()
        files = [(make_file(worker, tok, r, c), r) for r in
                 (make_rules(*shape, top_p=top_p, prompt_format=prompt_format)
                  for shape in SHAPES) for c in range(counters)]
        for (vdt, vs), profile in itertools.product(validators.items(), PROFILES):
            if profile == "meshrl-cpu-engine" and (dtype, vdt) != ("float32", "float32"):
                continue  # not honest for it: worker and validator refuse it (pool.unmet_profile)
            judged = []
            for i, f in enumerate(files):  # alternate the validator setups
                judged += judge(vs[i % len(vs)], tok, [f], profile)
            keys = sorted({k for _, _, r in judged for k in r})
            margin, p99 = {}, {}
            for k in keys:
                values = sorted(r[k] for _, _, r in judged if k in r)
                margin[k] = round(values[-1], 4)
                p99[k] = round(values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)], 4)
            rejected = [reason for ok, reason, _ in judged if not ok]
            worst_inexact = max((r.get("inexact_tokens", 0.0), i) for i, (_, _, r)
                                in enumerate(judged))
            line = {"worker": name, "dtype": dtype, "top_p": top_p, "profile": profile,
                    "files": len(judged), "accepted": len(judged) - len(rejected),
                    "margin": margin, "p99": p99, "rejected": rejected[:3],
                    "worst_inexact_file_tokens": sum(
                        len(r.completion_tokens) for r in files[worst_inexact[1]][0].completions),
                    "tokens": sum(len(r.completion_tokens) for rf, _ in files
                                  for r in rf.completions)}
            if len(validators) > 1:
                line["validator_dtype"] = vdt
            lines.append(line)
            log(json.dumps(lines[-1]))
        print(f"{name} top_p {top_p}: {len(files)} files, {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    return lines


def choosable(model: Any, tok: Any, tolerances: dict[str, float],
              counters: int) -> dict[str, Any]:
    """How many tokens of honest files have a runner-up within each tolerance of the sampler's
    pick: the tokens a cheater may choose freely (e.g. for a higher reward) and still pass."""
    engine = CPUEngine(model, tok, EngineConfig(num_threads=1))
    gaps = []
    for shape, c in itertools.product(SHAPES, range(counters)):
        rf = make_file(engine, tok, make_rules(*shape), c)
        rows = [r for r in rf.completions if r.completion_tokens]
        scored = engine.score([r.prompt_tokens for r in rows], [r.completion_tokens for r in rows],
                              return_hidden_states=False, return_logits=True)
        logits = torch.cat([s.logits for s in scored]).double()
        seq = [r.seq_id for r in rows for _ in r.completion_tokens]
        pos = [j for r in rows for j in range(len(r.completion_tokens))]
        scores = logits + gumbel_noise(rf.header.sampling_seed, seq, pos, logits.shape[-1])
        top2 = scores.topk(2, dim=-1).values
        gaps.append(top2[:, 0] - top2[:, 1])
    g = torch.cat(gaps)
    return {"exploit": "choose-inside-sampling-tolerance", "tokens": g.numel(),
            "choosable": {f"{name} ({tol:g})": round(float((g <= tol).float().mean()), 5)
                          for name, tol in tolerances.items()}}


def weight_cheats(model: Any, tok: Any, files: int) -> list[dict[str, Any]]:
    """Rejection rate of files generated with int8 weights or one layer x1.1 (float32 CPU engine,
    honest proofs of the cheat model), by file size in chunks, under each profile."""
    validator = CPUEngine(model, tok, EngineConfig(num_threads=1))
    out = []
    for name, bad in (("int8", quantize_weights(model, 8)), ("layer_mlp_x1.1",
                                                             scale_layer_mlp(model, 1.1))):
        worker = CPUEngine(bad, tok, EngineConfig(num_threads=1))
        for chunks in (1, 2, 4, 8, 13, 16, 32):
            rows = min(chunks, 16)
            rules = make_rules(32 * chunks // rows, rows, 1, ignore_eos=True)
            made = [(make_file(worker, tok, rules, c), rules) for c in range(files)]
            rec: dict[str, Any] = {"exploit": name, "chunks": chunks, "files": files}
            for profile in PROFILES:
                rec[profile] = sum(not ok for ok, _, _ in judge(validator, tok, made, profile))
            out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2-tiny")
    ap.add_argument("--checkpoint", default="", help="a trained policy's directory (a trainer "
                    "checkpoint or a shardcast version's data/) instead of a random init: "
                    "trained logits are sharper, and bf16 log-prob noise with them")
    ap.add_argument("--model-seed", type=int, default=3)
    ap.add_argument("--counters", type=int, default=6, help="files per shape and configuration")
    ap.add_argument("--workers", nargs="*", default=list(WORKERS))
    ap.add_argument("--cheat-files", type=int, default=8, help="files per cheat and size")
    ap.add_argument("--no-exploits", action="store_true")
    ap.add_argument("--prompt-format", default="raw", choices=("raw", "chat"),
                    help="chat: an instruct model's prompts through its chat template")
    ap.add_argument("--validator-dtypes", nargs="+", default=["float32"],
                    choices=("float32", "bfloat16", "float16"),
                    help="validators in other dtypes: the reference backend (issue #40)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.checkpoint:
        tok, model = load_tokenizer(args.checkpoint), load_model(args.checkpoint).float()
    else:
        tok = CharTokenizer()
        model = build_model(args.preset, tok.vocab_size, seed=args.model_seed)
    t0 = time.perf_counter()
    lines = honest_configs(model, tok, args.counters, args.workers, print, args.prompt_format,
                           tuple(args.validator_dtypes))
    files = sum(x["files"] for x in lines if x["profile"] == "any-hardware")
    bad = sum(x["files"] - x["accepted"] for x in lines)
    worst = {p: max(((v, k, x["worker"]) for x in lines if x["profile"] == p
                     for k, v in x["margin"].items()), default=None) for p in PROFILES}
    print(json.dumps({"summary": True, "preset": args.preset, "honest_files": files,
                      "judgements": sum(x["files"] for x in lines), "invalidated": bad,
                      "worst_margin": worst, "s": round(time.perf_counter() - t0, 1)}))
    if not args.no_exploits:
        tolerances = {p: profile_thresholds(p).max_sampling_margin for p in PROFILES}
        print(json.dumps(choosable(model, tok, {"before #22": 0.05, **tolerances}, 2)))
        for rec in weight_cheats(model, tok, args.cheat_files):
            print(json.dumps(rec))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
