"""The device check of issue #26: a GPU contributor's honest work, judged on GPU and CPU.

On `--device` (default cuda) in `--dtype` (default bfloat16): builds a real-architecture model
with random weights (`--size 0.5b`: a Qwen2-0.5B-like config, 494M parameters; `--size tiny`
for a CPU smoke run), generates honest completions with the reference backend there (the one
device-aware path every worker uses), proves them (TOPLOC), and validates them on the device
in the worker's dtype and on the CPU in float32 under the "any-hardware" profile: the TOPLOC
verdict per file, the sampler replay margin and the log-prob difference of every token
(0 rejections expected). Then the weight cheats (int8, int4, one layer's MLP x1.1, 1% weight
noise, another model) generate on the device and are validated on it (all caught). Last, decode
tokens/s of the backend against Hugging Face `generate` on the same device, same model, same
prompts (`speedup` = ours / HF's; the reference backend is a naive loop: expect about 1).

One JSON object per line; exit 1 when an honest file is rejected or a cheat file passes.

    bash benchmarks/gpu_check.sh                                  # on a CUDA machine, < 10 min
    PYTHONPATH=src python benchmarks/gpu_check.py --device cpu --dtype float32 --size tiny
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from typing import Any

import torch

from meshrl.inference import ReferenceBackend, SamplingParams
from meshrl.inference.device import check_device, place
from meshrl.inference.sampling import token_margins
from meshrl.toploc import build_proofs, perturb, verdict, verify_proofs
from meshrl.toploc.thresholds import Thresholds

SIZES = {  # Qwen2-0.5B's shape (random weights), and a CPU smoke size
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                 max_position_embeddings=256),
}


CHEATS = {"int8": lambda m: perturb.quantize_weights(m, 8),
          "int4": lambda m: perturb.quantize_weights(m, 4),
          "layer_mlp_x1.1": lambda m: perturb.scale_layer_mlp(m, 1.1),
          "noise_0.01": lambda m: perturb.noise_weights(m, 0.01),
          "other_model": None}  # another random model of the same shape


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def build(size: str, seed: int) -> Any:
    """A Qwen2 causal LM of `size` with random weights (float32, CPU)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SIZES[size], tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).eval()


def work(model: Any, prompts: list[list[int]], lengths: list[int], seed: int) -> list[Any]:
    """(tokens, proofs, claimed log-probs) per prompt from the backend on the model's device."""
    backend = ReferenceBackend(model)
    params = SamplingParams(max_new_tokens=max(lengths), seed=seed, ignore_eos=True,
                            return_hidden_states=True)
    out = []
    for g, n in zip(backend.generate(prompts, params), lengths, strict=True):
        out.append((g.token_ids[:n], build_proofs(g.hidden_states[:n]), g.logprobs[:n]))
    return out


def judge(model: Any, prompts: list[list[int]], rows: list[Any], seed: int, file_rows: int,
          th: Thresholds) -> dict[str, Any]:
    """Files rejected (TOPLOC, sampling replay, log-probs) when `model` recomputes `rows`."""
    res = ReferenceBackend(model).score(prompts, [t for t, _, _ in rows], return_logits=True)
    files, rejected, margin, lp_diff = 0, 0, 0.0, 0.0
    for lo in range(0, len(rows), file_rows):
        chunks, ok = [], True
        for i in range(lo, min(lo + file_rows, len(rows))):
            tokens, proofs, lps = rows[i]
            chunks += verify_proofs(res[i].hidden_states, proofs)
            m = token_margins(res[i].logits, torch.tensor(tokens), seed, [i] * len(tokens),
                              list(range(len(tokens))))
            d = (torch.tensor(lps) - res[i].logprobs).abs()
            margin, lp_diff = max(margin, float(m.max())), max(lp_diff, float(d.max()))
            ok &= bool(m.max() <= th.max_sampling_margin) and bool(d.max() <= th.max_logprob_diff)
        files += 1
        rejected += not (ok and verdict(chunks, th).accepted)
    return {"files": files, "files_rejected": rejected, "max_sampling_margin": round(margin, 5),
            "max_logprob_diff": round(lp_diff, 5)}


def decode_speed(model: Any, prompts: list[list[int]], new: int, device: str) -> dict[str, Any]:
    """Decode tokens/s of the reference backend and of HF generate, same model and prompts."""
    params = SamplingParams(max_new_tokens=new, seed=0, ignore_eos=True)
    backend = ReferenceBackend(model)
    backend.generate(prompts[:2], params.model_copy(update={"max_new_tokens": 4}))  # warm up
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t = time.perf_counter()
    backend.generate(prompts, params)
    sync()
    ours = len(prompts) * new / (time.perf_counter() - t)
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(backend.device), mask.to(backend.device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0, top_p=1.0,
              pad_token_id=0)
    with torch.no_grad():
        model.generate(input_ids=ids[:2], attention_mask=mask[:2], **{**kw, "max_new_tokens": 4,
                                                                      "min_new_tokens": 4})
        sync()
        t = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, **kw)
        sync()
    hf = len(prompts) * new / (time.perf_counter() - t)
    return {"batch": len(prompts), "new_tokens": new, "ours_tokens_per_s": round(ours, 1),
            "hf_tokens_per_s": round(hf, 1), "speedup": round(ours / hf, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--size", default="0.5b", choices=sorted(SIZES))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--file-rows", type=int, default=8)
    ap.add_argument("--speed-batch", type=int, default=16)
    ap.add_argument("--speed-tokens", type=int, default=64)
    ap.add_argument("--cheats", nargs="+", default=list(CHEATS), choices=list(CHEATS),
                    help="cheat modes to validate (all by default)")
    args = ap.parse_args(argv)
    t0 = time.time()
    info = check_device(args.device, args.dtype)  # one-line DeviceError when it is not there
    base = build(args.size, seed=0)
    params = sum(p.numel() for p in base.parameters())
    _emit({"device": info.to_dict(), "size": args.size, "parameters": params,
           "s": round(time.time() - t0, 1)})
    vocab = base.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (int(torch.randint(4, 24, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(args.prompts)]
    lengths = [1 + (i * 37) % 96 for i in range(args.prompts)]  # every chunk shape, 1 .. 96
    th = Thresholds()  # the "any-hardware" profile's
    gpu = place(copy.deepcopy(base), args.device, args.dtype)
    honest = work(gpu, prompts, lengths, seed=11)
    bad = 0
    for name, model in (("device-" + args.dtype, gpu), ("cpu-float32", base)):
        r = judge(model, prompts, honest, 11, args.file_rows, th)
        bad += r["files_rejected"]
        _emit({"honest": name, **r, "s": round(time.time() - t0, 1)})
    long = [64 + 1 + i % 32 for i in range(args.prompts)]  # files of real length
    missed = 0
    for name in args.cheats:
        change = CHEATS[name]
        cheat = place(change(base) if name != "other_model" else build(args.size, seed=12345),
                      args.device, args.dtype)
        rows = work(cheat, prompts, long, seed=13)
        del cheat
        r = judge(gpu, prompts, rows, 13, args.file_rows, th)
        missed += r["files"] - r["files_rejected"]
        _emit({"cheat": name, **r, "s": round(time.time() - t0, 1)})
    speed = decode_speed(gpu, prompts[: args.speed_batch], args.speed_tokens, info.device)
    _emit({"speed": speed, "device": info.device, "dtype": args.dtype,
           "s": round(time.time() - t0, 1)})
    ok = bad == 0 and missed == 0
    _emit({"ok": ok, "honest_files_rejected": bad, "cheat_files_missed": missed,
           "s": round(time.time() - t0, 1)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
