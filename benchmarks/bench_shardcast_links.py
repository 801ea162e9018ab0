"""Shardcast where links are the limit: origin + R relays + N clients, uploads capped at B.

Every role is its own `meshrl shardcast` process on loopback; `--server.max_upload_mbps` stands
for each server's upload link (origin and relays: B each; downloads are not capped). Clients wait
for version 1 with every server's URL; the time runs from the moment the version is visible in
the origin's store (published by hard link) until the last client logged `fetched` (its output
verified and renamed into place; `all_exited_s` adds the processes' exit).

For each R (0 = the star) a line reports that time, the origin's egress, the link-model bound
(every byte leaves the origin R times and reaches N clients through R + 1 uploaders:
`S * max(R, (R + N) / (R + 1)) / B`; `S * N / B` for the star) and `bound_fraction` = bound /
time, the origin's egress against its share under the bound (`S * max(R, (R + N) / (R + 1))`,
i.e. what it uploads in the bound's time), the prediction of `simulate_relays` for the same
setup, and the CPU the processes used (busy fraction of all cores: links, not CPU, must be the
limit). A relay mirrors everything, but clients need only the union of what the relays hold, so
with many relays (R > (R + N) / (R + 1)) clients can finish before the bound: the bound counts
full mirrors. A summary line gives `speedup_2_relays` = star time / time with 2 relays.

    python benchmarks/bench_shardcast_links.py [--size-mb 200] [--mbytes-per-s 10] [--relays 0,2,4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meshrl.shardcast.simulate import simulate_relays

import _shardcast_procs as sp
from _shardcast_procs import cpu_s, health, load1, wait_cpu
from meshrl.shardcast.store import VersionStore


def link_bound(size: float, rate: float, relays: int, clients: int) -> float:
    """Seconds the link model needs: the origin's and the average uploader's bytes over B."""
    if relays == 0:
        return size * clients / rate
    return size * max(relays, (relays + clients) / (relays + 1)) / rate


def run_topology(work: Path, src: Path, relays: int, args: argparse.Namespace) -> dict:
    """One broadcast of `src` to `args.clients` processes through `relays` relays."""
    mbps = str(args.mbytes_per_s * 8)
    with sp.tree(work, relays, args.clients,
                 origin_args=["--server.max_upload_mbps", mbps,
                              "--server.serve_clients", args.origin_serves],
                 relay_args=["--server.max_upload_mbps", mbps, "--client.concurrency",
                             str(args.relay_concurrency), "--client.fsync", "false"],
                 client_args=["--client.poll_interval", "0.05", "--client.concurrency",
                              str(args.concurrency)]) as t:
        procs, clients, logs, urls = t.servers, t.clients, t.logs, t.urls
        cpu0 = {p.pid: cpu_s(p.pid) for p in procs + clients}
        sampler = _Sampler(urls)
        VersionStore(work / "origin").publish(src, 1, args.shard_mb * 1_000_000, link=True,
                                              key=sp.KEY)
        t0, t0_wall = time.perf_counter(), time.time()
        client_cpu = 0.0
        for c in clients:
            rc, used = wait_cpu(c)
            if rc:
                raise RuntimeError(f"a client failed: {logs[clients.index(c)].read_text()[-2000:]}")
            client_cpu += used - cpu0[c.pid]
        exited = time.perf_counter() - t0
        sampler.stop(work / "timeline.log", t0_wall)
        wall = max(_fetched_at(log) for log in logs) - t0_wall
        services = [cpu_s(p.pid) - cpu0[p.pid] for p in procs]
        counters = health(t.origin)["counters"]
        return {"wall_s": wall, "exited_s": exited,
                "origin_bytes_sent": counters.get("bytes_sent", 0),
                "origin_bytes_to_relays": counters.get("bytes_sent_relays", 0),
                "origin_busy_refusals": counters.get("busy_refusals", 0),
                "origin_preempted": counters.get("preempted", 0),
                "cpu_s": {"origin": services[0], "relays": sum(services[1:]),
                          "clients": client_cpu}}


class _Sampler:
    """Every server's bytes_sent, twice a second (written next to the logs: who sent when)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.rows, self.done = urls, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.5):
            with contextlib.suppress(OSError):
                self.rows.append((time.time(), [health(u)["counters"].get("bytes_sent", 0)
                                                for u in self.urls]))

    def stop(self, path: Path, t0: float) -> None:
        self.done.set()
        self.thread.join()
        path.write_text("".join(json.dumps({"t": round(t - t0, 2), "mb_sent": [
            round(b / 1e6, 1) for b in sent]}) + "\n" for t, sent in self.rows))


def _fetched_at(log: Path) -> float:
    """Wall-clock time a client logged `fetched` (its output verified and renamed into place)."""
    for line in log.read_text().splitlines():
        if '"fetched"' in line:
            return json.loads(line)["ts"]
    raise RuntimeError(f"no fetched line in {log}")


def report(relays: int, r: dict, args: argparse.Namespace, load: float) -> dict:
    size, rate, n = args.size_mb * 1e6, args.mbytes_per_s * 1e6, args.clients
    bound = link_bound(size, rate, relays, n)
    sim = simulate_relays(n, relays, size, max(1, round(args.size_mb / args.shard_mb)), rate,
                          args.concurrency, args.relay_concurrency,
                          serve_clients=args.origin_serves).seconds
    share = bound * rate  # what the origin uploads in the bound's time
    line = {
        "bench": "shardcast_links", "relays": relays, "clients": n, "size_mb": args.size_mb,
        "shard_mb": args.shard_mb, "upload_MBps": args.mbytes_per_s,
        "upload_mbps": args.mbytes_per_s * 8, "origin_serves": args.origin_serves,
        "wall_s": round(r["wall_s"], 2), "all_exited_s": round(r["exited_s"], 2),
        "bound_s": round(bound, 2),
        "bound_fraction": round(bound / r["wall_s"], 3),
        "origin_egress_mb": round(r["origin_bytes_sent"] / 1e6, 1),
        "origin_to_relays_mb": round(r["origin_bytes_to_relays"] / 1e6, 1),
        "origin_share_mb": round(share / 1e6, 1),
        "origin_egress_over_share": round(r["origin_bytes_sent"] / share, 3),
        "origin_busy_refusals": r["origin_busy_refusals"],
        "origin_preempted": r["origin_preempted"],
        "sim_s": round(sim, 2), "measured_over_sim": round(r["wall_s"] / sim, 3),
        "cpu_s": {k: round(v, 2) for k, v in r["cpu_s"].items()},
        "cpu_busy": round(sum(r["cpu_s"].values()) / r["wall_s"] / os.cpu_count(), 3),
        "load_before": load, "load_after": load1(),
    }
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--shard-mb", type=float, default=2)
    ap.add_argument("--mbytes-per-s", type=float, default=10,
                    help="B: each server's upload (low enough that links, not the shared CPU, "
                    "are the limit)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--relays", default="0,2,4", help="comma-separated relay counts")
    ap.add_argument("--concurrency", type=int, default=4, help="shards per client at once")
    ap.add_argument("--relay-concurrency", type=int, default=2, help="shards per relay at once")
    ap.add_argument("--origin-serves", choices=["always", "spare", "never"], default="spare")
    ap.add_argument("--keep-logs", action="store_true", help="keep the last run's logs in /tmp")
    args = ap.parse_args()
    with sp.workdir("bench_shardcast_links_", args.size_mb, args.keep_logs) as (work, src):
        walls = {}
        for relays in (int(x) for x in args.relays.split(",")):
            os.sync()
            load = load1()
            walls[relays] = report(relays, run_topology(work, src, relays, args), args,
                                   load)["wall_s"]
        if 0 in walls and 2 in walls:
            print(json.dumps({"bench": "shardcast_links_summary",
                              "speedup_2_relays": round(walls[0] / walls[2], 2),
                              "load_after": load1()}))


if __name__ == "__main__":
    main()
