"""TOPLOC proof build / verify time per 1000 tokens, idle and with one core held by another process.

Prints one JSON object per line: per hidden size and condition ("idle"; "one_core_busy": a
competing process spins on one core for the whole measurement), then one summary line per
hidden size with the contended / idle ratios (goal: at most 2x; idle build <= 15 ms and verify
<= 4 ms at hidden 896). Activations are bf16 [1000, hidden] (normal values, like final hidden
states), k = 128, chunks of 32 tokens. Times are the median of `--repeats` runs after one
warm-up: wall-clock, and process CPU time (steadier on a shared machine). The proof kernels run
on one thread whatever the caller's count (`proofs.proof_threads`); `--threads` sets the
caller's count; `--caller-threads-in-kernels` measures the behaviour before issue 13 instead
(kernels on the caller's thread count) for comparison. Each line carries the 1-minute load
average, since the machine may be shared.
For reference, the issue measured the existing C++-accelerated TOPLOC on this CPU at about 18 ms
(build) and 4 ms (verify) per 1000 tokens at hidden 896.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from meshrl.toploc import build_proofs, verify_proofs
from meshrl.toploc import proofs as proofs_module


def _time(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median process CPU seconds."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


@contextmanager
def _busy_core() -> Iterator[None]:
    """Another process spinning at 100% of one core for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it get scheduled
        yield
    finally:
        proc.kill()
        proc.wait()


def _measure(acts: torch.Tensor, proofs: list[bytes], repeats: int) -> dict[str, float]:
    per_1k = 1000 / acts.shape[0]
    build = _time(lambda: build_proofs(acts), repeats)
    verify = _time(lambda: verify_proofs(acts, proofs), repeats)
    return {
        "build_ms_per_1k_tokens": round(build[0] * 1e3 * per_1k, 3),
        "verify_ms_per_1k_tokens": round(verify[0] * 1e3 * per_1k, 3),
        "build_cpu_ms_per_1k_tokens": round(build[1] * 1e3 * per_1k, 3),
        "verify_cpu_ms_per_1k_tokens": round(verify[1] * 1e3 * per_1k, 3),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hidden", type=int, nargs="+", default=[896, 4096])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0, help="caller's torch threads (0: as is)")
    ap.add_argument("--no-contention", action="store_true", help="idle measurement only")
    ap.add_argument("--caller-threads-in-kernels", action="store_true",
                    help="baseline: proof kernels on the caller's threads (before issue 13)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.caller_threads_in_kernels:
        proofs_module.proof_threads = contextlib.nullcontext  # type: ignore[assignment]
    for hidden in args.hidden:
        g = torch.Generator().manual_seed(hidden)
        acts = torch.randn(args.tokens, hidden, generator=g).to(torch.bfloat16)
        proofs = build_proofs(acts)
        assert all(r.exp_mismatches == 0 for r in verify_proofs(acts, proofs))
        base = {"bench": "toploc_proofs", "hidden": hidden, "tokens": args.tokens, "topk": 128,
                "chunk_size": 32, "dtype": "bfloat16", "caller_threads": torch.get_num_threads(),
                "kernel_threads": "caller" if args.caller_threads_in_kernels else 1,
                "proof_bytes_per_token": round(sum(map(len, proofs)) / args.tokens, 4)}
        idle = _measure(acts, proofs, args.repeats)
        print(json.dumps({**base, "condition": "idle", **idle}), flush=True)
        if args.no_contention:
            continue
        with _busy_core():
            busy = _measure(acts, proofs, args.repeats)
        print(json.dumps({**base, "condition": "one_core_busy", **busy}), flush=True)
        print(json.dumps({"bench": "toploc_contention", "hidden": hidden, **{
            f"{k}_busy_over_idle": round(busy[f"{k}_ms_per_1k_tokens"]
                                         / idle[f"{k}_ms_per_1k_tokens"], 2)
            for k in ("build", "verify")}}), flush=True)


if __name__ == "__main__":
    main()
