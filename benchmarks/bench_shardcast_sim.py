"""Broadcast time vs number of workers: star (origin serves everyone) vs relay tree.

1. Simulation (meshrl.shardcast.simulate): every node's upload is capped (default 1 Gbit/s,
   symmetric links), a 10 GB checkpoint in 50 MB shards, fanout-4 relay tree.
2. Validation on loopback: real origin / relays / clients (one process, asyncio) whose servers
   are throttled with `max_upload_rate`, small enough that the CPU is never the limit; the
   measured times are printed next to the simulation's prediction for the same setup.

Prints one JSON object per line; `speedup` = star time / tree time.

    python benchmarks/bench_shardcast_sim.py [--no-real]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshrl.shardcast import (
    ClientConfig,
    Origin,
    OriginConfig,
    Relay,
    RelayConfig,
    ServerConfig,
    ShardcastClient,
)
from meshrl.shardcast.simulate import build_topology, simulate


def sim_table(workers: list[int], size: float, shards: int, upload: float, fanout: int) -> None:
    for n in workers:
        star = simulate("star", n, size, shards, upload, download=upload, fanout=fanout)
        tree = simulate("tree", n, size, shards, upload, download=upload, fanout=fanout)
        print(json.dumps({
            "bench": "shardcast_sim", "workers": n, "size_gb": size / 1e9, "shards": shards,
            "upload_gbit": upload * 8 / 1e9, "fanout": fanout, "relays": tree.relays,
            "star_s": round(star.seconds, 1), "tree_s": round(tree.seconds, 1),
            "speedup": round(star.seconds / tree.seconds, 2),
        }))


async def real_run(kind: str, n: int, work: Path, size: int, shard: int, rate: float,
                   fanout: int) -> float:
    spec = build_topology(kind, n, fanout)
    server = ServerConfig(max_upload_rate=rate)
    fast = ClientConfig(poll_interval=0.02, fsync=False, concurrency=4, shard_order="sequential")
    origin = Origin(OriginConfig(root=str(work / "o"), server=server))
    urls = [await origin.start()]
    services: list = [origin]
    for name, parent in spec[1:]:
        if name.startswith("relay"):
            relay = Relay(RelayConfig(root=str(work / name), upstreams=[urls[parent]],
                                      server=server, client=fast))
            urls.append(await relay.start())
            services.append(relay)
        else:
            urls.append("")
    clients = [ShardcastClient([urls[p]], fast) for name, p in spec if name.startswith("worker")]
    src = work / "w.bin"
    src.write_bytes(bytes(range(256)) * (size // 256))
    fetches = [asyncio.create_task(c.fetch(work / f"out{i}", 1)) for i, c in enumerate(clients)]
    await asyncio.sleep(0.3)  # everyone is waiting for version 1
    t0 = time.perf_counter()
    await origin.publish(src, 1, shard)
    await asyncio.gather(*fetches)
    wall = time.perf_counter() - t0
    for c in clients:
        await c.close()
    for s in reversed(services):
        await s.stop()
    return wall


def real_table(workers: list[int], size: int, shard: int, rate: float, fanout: int) -> None:
    for n in workers:
        row = {"bench": "shardcast_loopback_throttled", "workers": n, "size_mb": size / 1e6,
               "upload_MBps": rate / 1e6, "fanout": fanout}
        for kind in ("star", "tree"):
            work = Path(tempfile.mkdtemp(prefix="bench_sc_sim_", dir="/tmp"))
            try:
                row[f"{kind}_s"] = round(asyncio.run(
                    real_run(kind, n, work, size, shard, rate, fanout)), 2)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            row[f"{kind}_sim_s"] = round(simulate(kind, n, size, size // shard, rate,
                                                  concurrency=4, fanout=fanout).seconds, 2)
        row["speedup"] = round(row["star_s"] / row["tree_s"], 2)
        print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-real", action="store_true", help="only the simulation")
    args = ap.parse_args()
    sim_table([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024], 10e9, 200, 125e6, 4)
    if not args.no_real:
        import logging

        logging.getLogger("meshrl").setLevel(logging.WARNING)
        real_table([1, 2, 4, 8], 2_000_000, 125_000, 4_000_000, 2)


if __name__ == "__main__":
    main()
