"""Broadcast time vs number of workers when uploads are the limit: star vs relays, simulated,
and the simulation checked against real processes.

1. `simulate` (fluid model, every node's upload capped, default 1 Gbit/s; a 10 GB checkpoint in
   50 MB shards): star vs a fanout-4 relay tree where each worker asks only its parent relay.
2. `simulate_relays`, the deployed shape: R = sqrt(N) relays mirror the origin, every worker asks
   any server that holds a shard, the origin serves relays first and workers only with spare
   upload (as `ShardServer` does).
3. Validation (skip with `--no-real`): the topologies of `bench_shardcast_links.py` (origin +
   0 / 2 / 4 relays + 8 clients, each its own process on loopback, uploads capped at B) run for
   real; each line gives the measured time next to `simulate_relays`' prediction for the same
   setup and their ratio (the goal: within 15%).

Prints one JSON object per line; `speedup` = star time / relays time.

    python benchmarks/bench_shardcast_sim.py [--no-real] [--size-mb 200] [--mbytes-per-s 10]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _shardcast_procs as sp
from _shardcast_procs import load1
from _shardcast_sim import simulate, simulate_relays
from bench_shardcast_links import link_bound, run_topology


def tree_table(workers: list[int], size: float, shards: int, upload: float, fanout: int) -> None:
    for n in workers:
        star = simulate("star", n, size, shards, upload, download=upload, fanout=fanout)
        tree = simulate("tree", n, size, shards, upload, download=upload, fanout=fanout)
        print(json.dumps({
            "bench": "shardcast_sim_tree", "workers": n, "size_gb": size / 1e9, "shards": shards,
            "upload_gbit": upload * 8 / 1e9, "fanout": fanout, "relays": tree.relays,
            "star_s": round(star.seconds, 1), "tree_s": round(tree.seconds, 1),
            "speedup": round(star.seconds / tree.seconds, 2),
        }), flush=True)


def relays_table(workers: list[int], size: float, shards: int, upload: float) -> None:
    for n in workers:
        r = max(1, round(math.sqrt(n)))
        star = n * size / upload  # the origin's upload carries every copy
        res = simulate_relays(n, r, size, shards, upload)
        print(json.dumps({
            "bench": "shardcast_sim_relays", "workers": n, "relays": r, "size_gb": size / 1e9,
            "shards": shards, "upload_gbit": upload * 8 / 1e9, "star_s": round(star, 1),
            "relays_s": round(res.seconds, 1), "bound_s": round(link_bound(size, upload, r, n), 1),
            "speedup": round(star / res.seconds, 2),
        }), flush=True)


def validate(args: argparse.Namespace) -> None:
    with sp.workdir("bench_shardcast_sim_", args.size_mb) as (work, src):
        size, rate = args.size_mb * 1e6, args.mbytes_per_s * 1e6
        shards = max(1, round(args.size_mb / args.shard_mb))
        for relays in (0, 2, 4):
            load = load1()
            measured = run_topology(work, src, relays, args)["wall_s"]
            sim = simulate_relays(args.clients, relays, size, shards, rate, args.concurrency,
                                  args.relay_concurrency, serve_clients=args.origin_serves)
            print(json.dumps({
                "bench": "shardcast_sim_vs_real", "relays": relays, "clients": args.clients,
                "size_mb": args.size_mb, "upload_MBps": args.mbytes_per_s,
                "measured_s": round(measured, 2), "sim_s": round(sim.seconds, 2),
                "measured_over_sim": round(measured / sim.seconds, 3), "goal": [0.85, 1.15],
                "load_before": load, "load_after": load1(),
            }), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-real", action="store_true", help="only the simulations")
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--shard-mb", type=float, default=2)
    ap.add_argument("--mbytes-per-s", type=float, default=10, help="B: each server's upload")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--relay-concurrency", type=int, default=2)
    ap.add_argument("--origin-serves", choices=["always", "spare", "never"], default="spare")
    args = ap.parse_args()
    tree_table([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024], 10e9, 200, 125e6, 4)
    relays_table([8, 16, 32, 64, 128], 10e9, 50, 125e6)
    if not args.no_real:
        import logging

        logging.getLogger("meshrl").setLevel(logging.WARNING)
        validate(args)


if __name__ == "__main__":
    main()
