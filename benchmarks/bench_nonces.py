"""What remembering nonces across restarts costs a signed request.

`RequestGuard.check` on N pre-signed requests (distinct nonces, one signer) with the in-memory
`NonceStore` (before) and with `SqliteNonceStore` on a WAL database in /tmp, as discovery and
the orchestrator open theirs (`synchronous=NORMAL`; `FULL` is the orchestrator's `durable`).
The same for the store alone (`seen` + `add`, no signature). Kinds run in alternating rounds;
each line is the median over rounds of microseconds per request, `overhead_us` the difference
to memory in the same rounds.

    python benchmarks/bench_nonces.py [--requests 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshrl.wire import GuardConfig, NonceStore, RequestGuard, SqliteNonceStore, sign_request

KEY = "0x" + "ab" * 32
KINDS = ("memory", "sqlite_normal", "sqlite_full")


def open_store(kind: str, path: Path) -> NonceStore:
    if kind == "memory":
        return NonceStore()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={kind.removeprefix('sqlite_').upper()}")
    return SqliteNonceStore(db)


def per_request_us(kind: str, work: Path, rnd: int, requests: list[dict[str, str]],
                   guarded: bool) -> float:
    store = open_store(kind, work / f"{kind}-{rnd}-{'guard' if guarded else 'store'}.db")
    now = time.time()
    if guarded:
        guard = RequestGuard(GuardConfig(rate_per_minute=10**9, rate_burst=10**9,
                                         ip_rate_per_minute=10**9, ip_burst=10**9),
                             nonces=store)
        t0 = time.perf_counter()
        for h in requests:
            guard.check("POST", "/x", h, b"{}")
    else:
        t0 = time.perf_counter()
        for h in requests:
            if not store.seen(h["x-address"], h["x-nonce"], now):
                store.add(h["x-address"], h["x-nonce"], now + 301)
    return (time.perf_counter() - t0) / len(requests) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ts = int(time.time()) + 60  # stays inside the window for the whole run
    requests = [sign_request(KEY, "POST", "/x", b"{}", timestamp=ts).as_dict()
                for _ in range(args.requests)]
    with tempfile.TemporaryDirectory(prefix="bench_nonces_") as tmp:
        for guarded in (True, False):
            got: dict[str, list[float]] = {k: [] for k in KINDS}
            load = round(os.getloadavg()[0], 2)
            for rnd in range(args.rounds):
                order = KINDS if rnd % 2 == 0 else KINDS[::-1]
                for kind in order:
                    got[kind].append(per_request_us(kind, Path(tmp), rnd, requests, guarded))
            base = statistics.median(got["memory"])
            for kind in KINDS:
                diffs = [a - b for a, b in zip(got[kind], got["memory"], strict=True)]
                print(json.dumps({
                    "bench": "nonces", "what": "guard.check" if guarded else "store only",
                    "store": kind, "requests": args.requests, "rounds": args.rounds,
                    "us_per_request": round(statistics.median(got[kind]), 2),
                    "overhead_us": round(statistics.median(diffs), 2),
                    "ratio_to_memory": round(statistics.median(got[kind]) / base, 3),
                    "load_before": load, "load_after": round(os.getloadavg()[0], 2)}),
                    flush=True)


if __name__ == "__main__":
    main()
