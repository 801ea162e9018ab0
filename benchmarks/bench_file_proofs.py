"""TOPLOC proofs of one rollout file: every row's chunks at once against row by row.

A worker proves each completion of a file and a validator checks each replayed one. Row by row
(`build_proofs` / `verify_proofs` per completion) a file of 128 completions of 8 tokens is 128
one-chunk calls of a few dozen small tensor operations each; `build_proofs_many` /
`verify_proofs_many` select, interpolate and evaluate the chunks of all rows together (the same
bytes and results: tests/toploc/test_proofs.py). Prints one JSON object per file shape: process
CPU seconds per file, median of `--repeats` runs after a warm-up, both ways interleaved in one
process on one thread (`speedup` = row by row / together, higher is better), and the 1-minute
load average (the machine may be shared).

    PYTHONPATH=src python benchmarks/bench_file_proofs.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from meshrl.toploc import build_proofs, build_proofs_many, verify_proofs, verify_proofs_many

# (rows, tokens per completion: low..high, hidden): the demo's files (16 prompts x 8, up to 8
# tokens, qwen2-tiny), the 25M preset's width, and long completions (several chunks a row)
SHAPES = [(128, (3, 8), 128), (128, (3, 8), 512), (32, (100, 300), 128)]


def _cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def _ways(acts: list[torch.Tensor], items: list[tuple[torch.Tensor, list[bytes]]],
          ) -> dict[str, Callable[[], object]]:
    return {
        "build_rows": lambda: [build_proofs(a) for a in acts],
        "build_together": lambda: build_proofs_many(acts),
        "verify_rows": lambda: [verify_proofs(a, p) for a, p in items],
        "verify_together": lambda: verify_proofs_many(items),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for rows, (lo, hi), hidden in SHAPES:
        g = torch.Generator().manual_seed(rows + hidden)
        lengths = torch.randint(lo, hi + 1, (rows,), generator=g).tolist()
        acts = [torch.randn(n, hidden, generator=g).to(torch.bfloat16) for n in lengths]
        proofs = build_proofs_many(acts)
        assert proofs == [build_proofs(a) for a in acts]
        items = [(a.float(), p) for a, p in zip(acts, proofs, strict=True)]
        ways = _ways(acts, items)
        times: dict[str, list[float]] = {k: [] for k in ways}
        for fn in ways.values():
            fn()  # warm-up (tables of field powers are built once)
        for _ in range(args.repeats):  # interleaved: load weighs on every way alike
            for k, fn in ways.items():
                times[k].append(_cpu(fn))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            "bench": "file_proofs", "rows": rows, "tokens": [lo, hi], "hidden": hidden,
            "chunks": sum(len(p) for p in proofs),
            **{f"{k}_cpu_ms": round(1000 * v, 2) for k, v in med.items()},
            "speedup": round(med["build_rows"] / med["build_together"], 2),
            "verify_speedup": round(med["verify_rows"] / med["verify_together"], 2),
            "load_1min": round(os.getloadavg()[0], 2),
        }), flush=True)


if __name__ == "__main__":
    main()
