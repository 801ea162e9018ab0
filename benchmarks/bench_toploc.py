"""TOPLOC proof build / verify time per 1000 tokens and proof size per token.

Prints one JSON object per line, one per hidden size. Activations are bf16 [1000, hidden]
(normal values, like final hidden states), k = 128, chunks of 32 tokens. Times are the median
of `--repeats` runs after one warm-up (wall-clock, and process CPU time, which is steadier on a
shared machine), on the current torch thread count or `--threads`. For reference, the
issue measured the existing C++-accelerated TOPLOC on this CPU at about 18 ms (build) and 4 ms
(verify) per 1000 tokens at hidden 896.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from meshrl.toploc import build_proofs, verify_proofs


def _time(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median process CPU seconds (the latter is steadier on a shared box)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hidden", type=int, nargs="+", default=[896, 4096])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for hidden in args.hidden:
        g = torch.Generator().manual_seed(hidden)
        acts = torch.randn(args.tokens, hidden, generator=g).to(torch.bfloat16)
        proofs = build_proofs(acts)
        assert all(r.exp_mismatches == 0 for r in verify_proofs(acts, proofs))
        build = _time(lambda a=acts: build_proofs(a), args.repeats)
        verify = _time(lambda a=acts, p=proofs: verify_proofs(a, p), args.repeats)
        per_1k = 1000 / args.tokens
        print(json.dumps({
            "bench": "toploc_proofs", "hidden": hidden, "tokens": args.tokens, "topk": 128,
            "chunk_size": 32, "dtype": "bfloat16", "threads": torch.get_num_threads(),
            "build_ms_per_1k_tokens": round(build[0] * 1e3 * per_1k, 3),
            "verify_ms_per_1k_tokens": round(verify[0] * 1e3 * per_1k, 3),
            "build_cpu_ms_per_1k_tokens": round(build[1] * 1e3 * per_1k, 3),
            "verify_cpu_ms_per_1k_tokens": round(verify[1] * 1e3 * per_1k, 3),
            "proof_bytes_per_token": round(sum(map(len, proofs)) / args.tokens, 4),
            # 1000 tokens end in a partial chunk of 8; whole chunks cost 258 / 32 bytes a token
            "proof_bytes_per_token_whole_chunks": round(
                sum(map(len, build_proofs(acts[:32]))) / 32, 4),
        }), flush=True)


if __name__ == "__main__":
    main()
