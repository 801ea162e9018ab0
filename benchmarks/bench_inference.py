"""meshrl's CPU engine vs `transformers` `generate` on the same model, batch and lengths.

For each (preset, batch, mode) both generate `--new-tokens` tokens after the same left-padded
random prompts, alternating runs (with `--model-dir`: that Hugging Face model, e.g. SmolLM2, and
chat-template prompts asking for a sum, difference or product of random numbers, instead of the
presets); the best of `--repeats` runs of each counts. Throughput counts
generated tokens up to and including EOS (HF keeps computing finished rows; the engine drops
them). `--group G` repeats each of batch / G prompts G times, as a worker's rows
(`group_size`) do. Prints one JSON object per line with `speedup` = engine tokens/s / generate
tokens/s end to end, then prefill and decode apart: each side also runs with one new token
(prefill + the first token, alternating with the others), `*_prefill_s` is the best of those,
and decode tokens/s = the tokens after each row's first / (best full run - best prefill run),
`decode_speedup` their ratio. The `cpu_*` figures are the same ratios over process CPU seconds
(steadier than wall time on a shared machine). Also the peak RSS growth during each run, the
fraction of this CPU's measured fp32 matmul throughput that the engine reaches (model FLOPs /
wall time), and the load averages before and after.

    python benchmarks/bench_inference.py [--presets qwen2-tiny,qwen2-25m] [--batches 32,128]
        [--new-tokens 128] [--modes greedy,sample] [--repeats 2] [--threads 0]
        [--decode-kernels auto|native|torch] [--onednn-weights auto|on|off]
        [--model-dir /work/smollm2-hf] [--top-p 1.0] [--group 1] [--share-prompts on|off]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms.

    Freed heap memory is returned to the OS first (malloc_trim), so a run does not look small
    just because it reuses pages the previous run left behind.
    """

    def __enter__(self) -> PeakRSS:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())

    @property
    def delta_mb(self) -> float:
        return round((self.peak - self.base) / 2**20, 1)


def matmul_gflops(n: int = 1024, seconds: float = 0.5, windows: int = 4) -> float:
    """fp32 GFLOP/s of n x n matmuls: the best of `windows` timed windows (a neighbour's burst
    in one window would otherwise lower the peak and inflate every fraction of it)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = 0.0
    for _ in range(windows):
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def model_flops(spec, prompt_lens: list[int], gen_lens: list[int]) -> float:
    """Multiply-adds x 2 of every token the engine processes (prompt + fed-back tokens)."""
    qd, kvd = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    per_tok = 2 * spec.layers * (spec.hidden * (2 * qd + 2 * kvd) + 3 * spec.hidden
                                 * spec.intermediate)
    total = 0.0
    for p, g in zip(prompt_lens, gen_lens, strict=True):
        n = p + g
        total += per_tok * n + 2 * spec.hidden * spec.vocab * (g + 1)
        total += 4 * spec.layers * qd * n * n / 2  # attention scores + weighted values
    return total


def kv_cache_bytes(spec, prompt_lens: list[int], new_tokens: int) -> int:
    slots = max(prompt_lens) + new_tokens - 1
    return 2 * 4 * spec.layers * len(prompt_lens) * spec.kv_heads * slots * spec.head_dim


def useful_tokens(rows: list[list[int]], eos: int) -> int:
    return sum(r.index(eos) + 1 if eos in r else len(r) for r in rows)


def run_hf(model, tok, prompts, params: SamplingParams) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    # from the lengths, not `ids != pad`: SmolLM2's pad is its EOS, <|im_end|>, which every
    # chat-template prompt contains (masking those made generate answer other prompts)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p} \
        if params.temperature > 0 else {"do_sample": False}
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=params.max_new_tokens,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)
    return out[:, width:].tolist()


def chat_prompts(tok, batch: int, g: torch.Generator) -> list[list[int]]:
    """Arithmetic questions through the model's chat template (SmolLM2: 45-50 tokens)."""
    nums = torch.randint(2, 1000, (batch, 2), generator=g).tolist()
    ops = torch.randint(0, 3, (batch,), generator=g).tolist()
    return [tok.encode(tok.chat_prompt(f"What is {a} {'+-*'[o]} {b}? Answer with the number."))
            for (a, b), o in zip(nums, ops, strict=True)]


def bench(preset: str, batch: int, mode: str, args, peak: float, loaded=None) -> dict:
    if loaded is None:
        tok = CharTokenizer()
        model = build_model(preset, tok.vocab_size, seed=0)
    else:
        model, tok = loaded
    engine = CPUEngine(model, tok, EngineConfig(max_batch_size=batch,
                                                decode_kernels=args.decode_kernels,
                                                onednn_weights=args.onednn_weights,
                                                share_prompts=args.share_prompts == "on"))
    g = torch.Generator().manual_seed(batch)
    if loaded is None:
        lens = torch.randint(args.prompt_min, args.prompt_max + 1, (batch // args.group,),
                             generator=g).tolist()
        prompts = [q for n in lens for q in
                   [torch.randint(4, tok.vocab_size, (n,), generator=g).tolist()] * args.group]
        lens = [len(q) for q in prompts]
    else:
        prompts = chat_prompts(tok, batch // args.group, g)
        prompts = [q for q in prompts for _ in range(args.group)]  # a worker's rows (group_size)
        lens = [len(p) for p in prompts]
    params = SamplingParams(max_new_tokens=args.new_tokens, seed=1,
                            temperature=0.0 if mode == "greedy" else 1.0,
                            top_p=1.0 if mode == "greedy" else args.top_p)
    load_before = [round(x, 2) for x in os.getloadavg()]
    warm = params.model_copy(update={"max_new_tokens": 4})
    first = params.model_copy(update={"max_new_tokens": 1})  # prefill + the first token
    engine.generate(prompts, warm)
    run_hf(model, tok, prompts, warm)
    inf = (float("inf"), None, None)
    best = {"engine": inf, "hf": inf, "engine_prefill": inf, "hf_prefill": inf}
    cpu = dict.fromkeys(best, float("inf"))  # process CPU seconds: they hold under load
    for _ in range(args.repeats):
        for name in ("engine_prefill", "hf_prefill", "engine", "hf"):
            p = first if name.endswith("_prefill") else params
            with PeakRSS() as mem:
                t0, c0 = time.perf_counter(), time.process_time()
                if name.startswith("engine"):
                    rows = [c.token_ids for c in engine.generate(prompts, p)]
                else:
                    rows = run_hf(model, tok, prompts, p)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
            cpu[name] = min(cpu[name], dc)
            if dt < best[name][0]:
                best[name] = (dt, rows, mem.delta_mb)
    (t_e, rows_e, mem_e), (t_h, rows_h, mem_h) = best["engine"], best["hf"]
    pre_e, pre_h = best["engine_prefill"][0], best["hf_prefill"][0]
    n_e, n_h = useful_tokens(rows_e, tok.eos_token_id), useful_tokens(rows_h, tok.eos_token_id)
    # decode: the tokens after each row's first (the prefill run makes that one) over the time
    # past the prefill run, each side against its own prefill-only run
    dec_e, dec_h = (n_e - batch) / max(t_e - pre_e, 1e-9), (n_h - batch) / max(t_h - pre_h, 1e-9)
    gen_lens = [len(r) for r in rows_e]
    flops = model_flops(engine.spec, lens, gen_lens)
    dec_flops = flops - model_flops(engine.spec, lens, [1] * batch)
    return {
        "bench": "inference", "preset": preset, "params": sum(p.numel() for p in
                                                              model.parameters()),
        "batch": batch, "group": args.group, "mode": mode, "new_tokens": args.new_tokens,
        "decode_kernels": "torch" if engine.kernels is None else "native",
        "onednn_weights": engine.packed is not None, "share_prompts": args.share_prompts,
        "top_p": params.top_p, "prompt_len": [min(lens), max(lens)],
        "threads": torch.get_num_threads(),
        "engine_tokens_per_s": round(n_e / t_e, 1), "hf_generate_tokens_per_s": round(n_h / t_h, 1),
        "speedup": round((n_e / t_e) / (n_h / t_h), 3),
        "engine_prefill_s": round(pre_e, 3), "hf_prefill_s": round(pre_h, 3),
        "prefill_speedup": round(pre_h / pre_e, 3),
        "engine_decode_tokens_per_s": round(dec_e, 1), "hf_decode_tokens_per_s": round(dec_h, 1),
        "decode_speedup": round(dec_e / dec_h, 3),
        "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_speedup": round((n_e / cpu["engine"]) / (n_h / cpu["hf"]), 3),
        "cpu_prefill_speedup": round(cpu["hf_prefill"] / cpu["engine_prefill"], 3),
        "cpu_decode_speedup": round((n_e - batch) / max(cpu["engine"] - cpu["engine_prefill"], 1e-9)
                                    / ((n_h - batch) / max(cpu["hf"] - cpu["hf_prefill"], 1e-9)),
                                    3),
        "engine_tokens": n_e, "hf_tokens": n_h,
        "same_tokens": [r[: len(e)] for r, e in zip(rows_h, rows_e, strict=True)] == rows_e
        if mode == "greedy" else None,
        "engine_peak_rss_mb": mem_e, "hf_peak_rss_mb": mem_h,
        "engine_kv_cache_mb": round(kv_cache_bytes(engine.spec, lens, args.new_tokens) / 2**20, 1),
        "engine_gflops": round(flops / t_e / 1e9, 2), "matmul_peak_gflops": round(peak, 2),
        "fraction_of_matmul_peak": round(flops / t_e / 1e9 / peak, 4),
        "decode_fraction_of_matmul_peak": round(dec_flops / max(t_e - pre_e, 1e-9) / 1e9 / peak,
                                                4),
        "load_average_before": load_before,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="qwen2-tiny,qwen2-25m")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-min", type=int, default=8)
    ap.add_argument("--prompt-max", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch default")
    ap.add_argument("--decode-kernels", default="auto", choices=["auto", "native", "torch"],
                    help="the engine's decode step (EngineConfig.decode_kernels)")
    ap.add_argument("--onednn-weights", default="auto", choices=["auto", "on", "off"],
                    help="native decode matmuls on oneDNN-reordered weights (EngineConfig)")
    ap.add_argument("--model-dir", default=None,
                    help="a HF model directory (e.g. SmolLM2) with chat-template prompts, "
                         "instead of the presets")
    ap.add_argument("--top-p", type=float, default=1.0, help="top_p of the sampled mode")
    ap.add_argument("--share-prompts", default="on", choices=["on", "off"],
                    help="prefill repeated prompts and a shared prefix once (EngineConfig)")
    ap.add_argument("--group", type=int, default=1,
                    help="rows per distinct prompt (a worker's group_size); divides each batch")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = matmul_gflops()
    loaded = None
    if args.model_dir:
        loaded = (load_model(args.model_dir), load_tokenizer(args.model_dir))
        args.presets = Path(args.model_dir).name
    for preset in args.presets.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for mode in args.modes.split(","):
                print(json.dumps(bench(preset, batch, mode, args, peak, loaded)), flush=True)


if __name__ == "__main__":
    main()
