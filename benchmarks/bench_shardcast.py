"""Shardcast vs a plain static HTTP server, on loopback.

Tree: an origin, R relays and C clients, each its own `meshrl shardcast` process (as deployed).
The clients wait for version 1; the wall time runs from the start of `publish` (hash + copy into
the origin's store) until every client has exited holding the verified file. Baseline: the same C
downloads of the same file from `python -m http.server` with `curl`.

The two run in alternating rounds (plain, tree, tree, plain, ...) after a `sync`, so background
load and disk writeback hit both alike. Prints one JSON object per run and a summary line;
`ratio` = tree aggregate throughput / plain aggregate throughput of the same round (higher is
better), `ratio_median` over the rounds. `cpu_per_100MB` splits CPU-seconds by role: what one
receiver (our client, curl) spends per 100 MB delivered is the number to compare when the machine
is CPU-bound (2 shared cores: then the wall ratio follows the CPU ratio).

    python benchmarks/bench_shardcast.py [--size-mb 500] [--shard-mb 50] [--clients 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _shardcast_procs as sp
from _shardcast_procs import cpu_s, health, load1, wait_cpu


def plain(work: Path, src: Path, clients: int) -> dict:
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(src.parent)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        port = int(line.split(" port ")[1].split()[0])
        url = f"http://127.0.0.1:{port}/{src.name}"
        time.sleep(0.3)
        t0, cpu0 = time.perf_counter(), cpu_s(server.pid)
        curls = [subprocess.Popen(["curl", "-sf", "-o", str(work / f"plain{i}"), url])
                 for i in range(clients)]
        cpu = 0.0
        for c in curls:
            rc, used = wait_cpu(c)
            if rc:
                raise RuntimeError("curl failed")
            cpu += used
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "curl_cpu_s": cpu, "server_cpu_s": cpu_s(server.pid) - cpu0}
    finally:
        server.kill()
        server.wait()
        for i in range(clients):
            with contextlib.suppress(FileNotFoundError):
                (work / f"plain{i}").unlink()


def tree(work: Path, src: Path, args: argparse.Namespace) -> dict:
    from meshrl.shardcast.store import VersionStore

    with sp.tree(work, args.relays, args.clients, client_args=args.client_args,
                 client_stdout=subprocess.PIPE) as t:
        cpu0 = {p.pid: cpu_s(p.pid) for p in t.servers + t.clients}
        t0, own0 = time.perf_counter(), time.process_time()
        VersionStore(work / "origin").publish(src, 1, args.shard_mb * 1_000_000, link=args.link,
                                              key=sp.KEY)
        t_pub = time.perf_counter() - t0
        publish_cpu = time.process_time() - own0
        ends, client_cpu = [], 0.0
        for c in t.clients:
            rc, used = wait_cpu(c)
            if rc:
                raise RuntimeError("a client failed")
            client_cpu += used - cpu0[c.pid]
            ends.append(time.perf_counter() - t0)
            if args.verbose:
                print(c.stdout.read().decode().strip(), round(ends[-1], 3), "cpu",
                      round(cpu0[c.pid], 3), round(used, 3), file=sys.stderr)
        wall = max(ends)
        services = [cpu_s(p.pid) - cpu0[p.pid] for p in t.servers]  # until now
        relay_health = [health(u) for u in t.relays]
        for i in range(args.clients):
            if not _same(work / f"out{i}", src):
                raise RuntimeError(f"client {i} holds a different file")
        deadline = time.time() + 60
        while time.time() < deadline and any("1" not in h.get("mirrored", {})
                                             for h in relay_health):
            time.sleep(0.2)
            relay_health = [health(u) for u in t.relays]
        return {"wall_s": wall, "publish_s": t_pub, "relays": relay_health,
                "publish_cpu_s": publish_cpu, "client_cpu_s": client_cpu,
                "origin_cpu_s": services[0], "relay_cpu_s": sum(services[1:]),
                "origin_bytes_sent": health(t.origin)["counters"].get("bytes_sent", 0)}


def _same(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and _sha(a) == _sha(b)


def _sha(p: Path) -> str:
    from meshrl.shardcast.manifest import sha256_file

    return sha256_file(p)


def _settle() -> None:
    """Flush dirty pages so one run's writeback does not slow the next."""
    os.sync()
    time.sleep(1.0)


def report_plain(args: argparse.Namespace, rnd: int, r: dict, load: float) -> dict:
    total, per100 = args.size_mb * 1e6 * args.clients, args.size_mb * args.clients / 100
    line = {"bench": "shardcast_plain_http", "round": rnd, "size_mb": args.size_mb,
            "clients": args.clients, "wall_s": round(r["wall_s"], 3),
            "aggregate_MBps": round(total / r["wall_s"] / 1e6, 1),
            "cpu_s": round(r["curl_cpu_s"] + r["server_cpu_s"], 3),
            "cpu_per_100MB": {"curl": round(r["curl_cpu_s"] / per100, 3),
                              "server": round(r["server_cpu_s"] / per100, 3)},
            "load_before": load, "load_after": load1()}
    print(json.dumps(line), flush=True)
    return line


def report_tree(args: argparse.Namespace, rnd: int, t: dict, plain_line: dict | None,
                load: float) -> dict:
    total, mb = args.size_mb * 1e6 * args.clients, args.size_mb
    cpu = t["publish_cpu_s"] + t["client_cpu_s"] + t["origin_cpu_s"] + t["relay_cpu_s"]
    pipelined = {
        f"relay{i}": {
            "pipelined_shards": h["pipelined_shards"].get("1", 0),
            "first_serve_before_mirror_complete_s": round(
                h["mirrored"]["1"]["complete"] - h["first_serve"]["1"], 3)
            if "1" in h["first_serve"] and "1" in h["mirrored"] else None,
            "bytes_sent": h["counters"].get("bytes_sent", 0),
        }
        for i, h in enumerate(t["relays"])
    }
    line = {
        "bench": "shardcast_tree", "round": rnd, "size_mb": mb, "clients": args.clients,
        "relays": args.relays, "shard_mb": args.shard_mb, "publish_link": args.link,
        "wall_s": round(t["wall_s"], 3), "publish_s": round(t["publish_s"], 3),
        "aggregate_MBps": round(total / t["wall_s"] / 1e6, 1),
        "cpu_s": round(cpu, 3),
        "cpu_per_100MB": {
            "client": round(t["client_cpu_s"] / (mb * args.clients / 100), 3),
            "relay": round(t["relay_cpu_s"] / (mb * args.relays / 100), 3) if args.relays else None,
            "origin_per_100MB_sent": round(t["origin_cpu_s"] / (t["origin_bytes_sent"] / 1e8), 3)
            if t["origin_bytes_sent"] else None,
            "publish": round(t["publish_cpu_s"] / (mb / 100), 3),
        },
        "origin_bytes_sent": t["origin_bytes_sent"], **pipelined,
        "load_before": load, "load_after": load1(),
    }
    if plain_line is not None:
        line["ratio"] = round(plain_line["wall_s"] / t["wall_s"], 3)
        line["ratio_excluding_publish"] = round(
            plain_line["wall_s"] / (t["wall_s"] - t["publish_s"]), 3)
        line["cpu_ratio"] = round(cpu / plain_line["cpu_s"], 3)
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=500, help="file size (try 100 to iterate)")
    ap.add_argument("--shard-mb", type=int, default=50)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--relays", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="plain + tree pairs, order alternating")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--link", action="store_true", help="publish by hard link (no copy)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the services' logs in /tmp")
    ap.add_argument("--client-args", type=shlex.split, default=[],
                    help="extra `meshrl shardcast fetch` flags, e.g. '--client.concurrency 2'")
    args = ap.parse_args()
    with sp.workdir("bench_shardcast_", args.size_mb, args.keep_logs) as (work, src):
        ratios = []
        for rnd in range(args.rounds):
            order = ["plain", "tree"] if rnd % 2 == 0 else ["tree", "plain"]
            got: dict[str, tuple[dict, float]] = {}
            for kind in order:
                _settle()
                load = load1()
                got[kind] = (plain(work, src, args.clients) if kind == "plain"
                             else tree(work, src, args), load)
            p_line = report_plain(args, rnd, *got["plain"])
            t_line = report_tree(args, rnd, got["tree"][0], p_line, got["tree"][1])
            ratios.append(t_line["ratio"])
        print(json.dumps({"bench": "shardcast_summary", "size_mb": args.size_mb,
                          "rounds": args.rounds, "ratios": ratios,
                          "ratio_median": round(statistics.median(ratios), 3), "goal": 0.8,
                          "load_after": load1()}))


if __name__ == "__main__":
    main()
