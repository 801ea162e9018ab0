"""Shardcast vs a plain static HTTP server, on loopback.

Tree: an origin, R relays and C clients, each its own `meshrl shardcast` process (as deployed).
The clients wait for version 1; the wall time runs from the start of `publish` (hash + copy into
the origin's store) until every client has exited holding the verified file. Baseline: the same C
downloads of the same file from `python -m http.server` with `curl`. Prints one JSON object per
line; `ratio` = tree aggregate throughput / plain aggregate throughput (higher is better).

    python benchmarks/bench_shardcast.py [--size-mb 500] [--shard-mb 50] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
ENV = {**os.environ, "PYTHONPATH": str(SRC)}


def make_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 << 20)
            f.write(os.urandom(n))
            left -= n


def spawn(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    err = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "shardcast", *args],
                            stdout=subprocess.DEVNULL, stderr=err, env=ENV)
    for _ in range(400):
        for line in log.read_text().splitlines():
            if '"shardcast server up"' in line:
                return proc, json.loads(line)["url"]
        time.sleep(0.05)
    raise RuntimeError(log.read_text())


def health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health") as r:
        return json.load(r)


def plain(work: Path, src: Path, clients: int) -> float:
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1",
                               "--directory", str(src.parent)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        port = int(line.split(" port ")[1].split()[0])
        url = f"http://127.0.0.1:{port}/{src.name}"
        t0 = time.perf_counter()
        curls = [subprocess.Popen(["curl", "-sf", "-o", str(work / f"plain{i}"), url])
                 for i in range(clients)]
        if any(c.wait() for c in curls):
            raise RuntimeError("curl failed")
        return time.perf_counter() - t0
    finally:
        server.kill()
        server.wait()


def tree(work: Path, src: Path, args: argparse.Namespace) -> dict:
    from meshrl.shardcast.store import VersionStore

    procs: list[subprocess.Popen] = []
    try:
        origin, ourl = spawn(["origin", "--root", str(work / "origin"), "--server.port", "0",
                              "--server.scan_interval", "0.02"], work / "origin.log")
        procs.append(origin)
        relays = []
        for i in range(args.relays):
            p, url = spawn(["relay", "--root", str(work / f"relay{i}"), "--upstreams", f'["{ourl}"]',
                            "--server.port", "0", "--client.poll_interval", "0.05"],
                           work / f"relay{i}.log")
            procs.append(p)
            relays.append(url)
        urls = json.dumps([ourl, *relays])
        clients = [subprocess.Popen(
            [sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--server.urls", urls,
             "--version", "1", "--out", str(work / f"out{i}"), "--client.fsync", "false",
             "--client.poll_interval", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
            for i in range(args.clients)]
        time.sleep(2.0)  # clients and relays are up and long-polling for version 1
        t0 = time.perf_counter()
        VersionStore(work / "origin").publish(src, 1, args.shard_mb * 1_000_000)
        t_pub = time.perf_counter() - t0
        ends = []
        for c in clients:
            if c.wait():
                raise RuntimeError("a client failed")
            ends.append(time.perf_counter() - t0)
        wall = max(ends)
        relay_health = [health(u) for u in relays]
        for i in range(args.clients):
            if not _same(work / f"out{i}", src):
                raise RuntimeError(f"client {i} holds a different file")
        deadline = time.time() + 60
        while any("1" not in h.get("mirrored", {}) for h in relay_health) and time.time() < deadline:
            time.sleep(0.2)
            relay_health = [health(u) for u in relays]
        return {"wall_s": wall, "publish_s": t_pub, "relays": relay_health,
                "origin_bytes_sent": health(ourl)["counters"].get("bytes_sent", 0)}
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _same(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and _sha(a) == _sha(b)


def _sha(p: Path) -> str:
    from meshrl.shardcast.manifest import sha256_file

    return sha256_file(p)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--shard-mb", type=int, default=50)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--relays", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_shardcast_", dir="/tmp"))
    try:
        size = args.size_mb * 1_000_000
        src = work / "src" / "weights.bin"
        src.parent.mkdir()
        make_file(src, size)
        plain_s = plain(work, src, args.clients)
        for i in range(args.clients):
            (work / f"plain{i}").unlink()
        t = tree(work, src, args)
        total = size * args.clients
        common = {"size_mb": args.size_mb, "clients": args.clients}
        print(json.dumps({"bench": "shardcast_plain_http", **common, "wall_s": round(plain_s, 3),
                          "aggregate_MBps": round(total / plain_s / 1e6, 1)}))
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
        tree_tp = total / t["wall_s"]
        print(json.dumps({
            "bench": "shardcast_tree", **common, "relays": args.relays, "shard_mb": args.shard_mb,
            "wall_s": round(t["wall_s"], 3), "publish_s": round(t["publish_s"], 3),
            "aggregate_MBps": round(tree_tp / 1e6, 1),
            "ratio": round(tree_tp / (total / plain_s), 3),
            "ratio_excluding_publish": round(plain_s / (t["wall_s"] - t["publish_s"]), 3),
            "origin_bytes_sent": t["origin_bytes_sent"], **pipelined,
        }))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
