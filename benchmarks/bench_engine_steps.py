"""Where a CPUEngine run on a HF model goes: prefill (every row whole, and the engine's, which
prefills the prompts' shared prefix once), then per decode step the layers, the LM head,
the sampler (with and without top-p), log-softmax and a greedy argmax (torch's), the native greedy
pick the engine uses instead (argmax + log-prob); with --hf, greedy steps against the HF model's.
One JSON line.

    python benchmarks/bench_engine_steps.py --model-dir /work/smollm2-hf [--batch 32]
        [--steps 16] [--threads 1] [--hf]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from bench_inference import chat_prompts
from meshrl.inference import CPUEngine, EngineConfig
from meshrl.inference.engine import _left_pad, _real_slots
from meshrl.inference.native import NativeWorkspace, decode_step_native
from meshrl.inference.sampling import BatchSampler
from meshrl.inference.transformer import KVCache, forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hf", action="store_true",
                    help="also time greedy decode steps against the HF model's, alternating")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, steps = args.batch, args.steps
    eng = CPUEngine.from_pretrained(args.model_dir, EngineConfig(max_batch_size=b,
                                                                 decode_kernels="native"))
    w, packed = eng.weights, eng.packed
    prompts = chat_prompts(eng.tokenizer, b, torch.Generator().manual_seed(b))
    lens = torch.tensor([len(p) for p in prompts])
    width = int(lens.max())
    ids, pos, allowed, pad = _left_pad(prompts)
    acc = dict.fromkeys(["layers", "lm_head", "sample", "sample_top_p_0.9", "log_softmax",
                         "greedy_argmax", "native_greedy_pick"], 0.0)
    with torch.inference_mode():
        cache = KVCache(eng.spec, b, width + steps)
        t = time.perf_counter()
        h = forward(w, ids, pos, allowed, cache, _real_slots(pad, width))[lens.cumsum(0) - 1]
        prefill = time.perf_counter() - t
        # the engine's own prefill: the prompts' shared prefix (chat template) once
        t = time.perf_counter()
        h_shared, _ = eng._prefill(w, prompts, KVCache(eng.spec, b, width + steps), width)
        prefill_shared = time.perf_counter() - t
        shared_diff = float((h_shared - h).abs().max())
        ws = NativeWorkspace.allocate(w, b)
        plain = BatchSampler(1, list(range(b)), eng.spec.vocab, 1.0, 1.0, native=eng.kernels)
        nucleus = BatchSampler(1, list(range(b)), eng.spec.vocab, 1.0, 0.9, native=eng.kernels)
        p, start = pos[:, -1].clone() + 1, pad.clone()
        for j in range(steps):
            marks = [time.perf_counter()]
            logits = h @ w.lm_head
            marks.append(time.perf_counter())
            tok = plain.sample(logits, j)
            marks.append(time.perf_counter())
            nucleus.sample(logits, j)
            marks.append(time.perf_counter())
            logits.log_softmax(-1).gather(1, tok[:, None])
            marks.append(time.perf_counter())
            logits.argmax(-1)
            marks.append(time.perf_counter())
            eng.kernels.token_logprob(logits, None, 1.0)  # argmax + log-prob, as the engine does
            marks.append(time.perf_counter())
            h = decode_step_native(eng.kernels, w, tok, p, cache, width + j, start, ws,
                                   packed=packed)
            marks.append(time.perf_counter())
            p += 1
            for name, a, z in zip(["lm_head", "sample", "sample_top_p_0.9", "log_softmax",
                                   "greedy_argmax", "native_greedy_pick", "layers"],
                                  marks[:-1], marks[1:], strict=True):
                acc[name] += z - a
    out = {"bench": "engine_steps", "model": Path(args.model_dir).name, "batch": b,
           "prompt_tokens": int(lens.sum()), "prefill_s": round(prefill, 3),
           "prefill_shared_prefix_s": round(prefill_shared, 3),
           "shared_prefix_max_hidden_diff": shared_diff,
           "threads": torch.get_num_threads()}
    out.update({f"{k}_ms_per_step": round(v / steps * 1000, 1) for k, v in acc.items()})
    if args.hf:
        out.update(greedy_steps_against_hf(args.model_dir, eng, prompts, steps))
    print(json.dumps(out), flush=True)


def greedy_steps_against_hf(model_dir: str, eng: CPUEngine, prompts: list[list[int]],
                            steps: int) -> dict:
    """One greedy decode step of the engine (layers, LM head, argmax, log-softmax) against one
    of the HF model with its cache (forward on the last token, argmax), steps alternating on the
    same prompts; the min and median over steps of wall and of thread CPU time (which holds
    better than wall when neighbours take the cores)."""
    from meshrl.model import load_model

    model = load_model(model_dir)
    w, b = eng.weights, len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    width = int(lens.max())
    _, pos, _, pad = _left_pad(prompts)
    hf_ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    times: dict[str, list[tuple[float, float]]] = {"engine": [], "hf": []}
    with torch.inference_mode():
        cache = KVCache(eng.spec, b, width + steps)
        h, _ = eng._prefill(w, prompts, cache, width)
        ws = NativeWorkspace.allocate(w, b)
        p, start = pos[:, -1].clone() + 1, pad.clone()
        o = model(hf_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                  use_cache=True, logits_to_keep=1)
        past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1)
        for j in range(steps):
            t, c = time.perf_counter(), time.thread_time()
            logits = h @ w.lm_head
            tok, _ = eng.kernels.token_logprob(logits, None, 1.0)  # the engine's greedy pick
            h = decode_step_native(eng.kernels, w, tok, p, cache, width + j, start, ws,
                                   packed=eng.packed)
            p += 1
            times["engine"].append((time.perf_counter() - t, time.thread_time() - c))
            t, c = time.perf_counter(), time.thread_time()
            mask = torch.cat([mask, mask.new_ones(b, 1)], 1)
            o = model(nxt[:, None], attention_mask=mask, past_key_values=past, use_cache=True,
                      position_ids=(mask.sum(-1) - 1)[:, None])
            past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1)
            times["hf"].append((time.perf_counter() - t, time.thread_time() - c))
    out = {}
    for name, ts in times.items():
        wall, cpu = torch.tensor(ts).T
        out |= {f"{name}_greedy_step_ms_wall_min_median": [round(float(wall.min()) * 1e3, 1),
                                                          round(float(wall.median()) * 1e3, 1)],
                f"{name}_greedy_step_ms_cpu_min_median": [round(float(cpu.min()) * 1e3, 1),
                                                         round(float(cpu.median()) * 1e3, 1)]}
    he, hh = times["engine"], times["hf"]
    out["step_speedup_cpu_median"] = round(float(torch.tensor([c for _, c in hh]).median()
                                                 / torch.tensor([c for _, c in he]).median()), 3)
    out["step_speedup_wall_min"] = round(min(x for x, _ in hh) / min(x for x, _ in he), 3)
    return out


if __name__ == "__main__":
    main()
