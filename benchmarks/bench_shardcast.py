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


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def wait_cpu(proc: subprocess.Popen) -> tuple[int, float]:
    """Reap `proc`; its exit code and total CPU seconds."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_utime + ru.ru_stime


def health(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health") as r:
        return json.load(r)


def plain(work: Path, src: Path, clients: int) -> tuple[float, float]:
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
        return wall, cpu + cpu_s(server.pid) - cpu0
    finally:
        server.kill()
        server.wait()


def tree(work: Path, src: Path, args: argparse.Namespace) -> dict:
    from meshrl.shardcast.store import VersionStore

    procs: list[subprocess.Popen] = []
    clients: list[subprocess.Popen] = []
    try:
        origin, ourl = spawn(["origin", "--root", str(work / "origin"), "--server.port", "0",
                              "--server.scan_interval", "0.02"], work / "origin.log")
        procs.append(origin)
        relays = []
        for i in range(args.relays):
            p, url = spawn(["relay", "--root", str(work / f"relay{i}"),
                            "--upstreams", f'["{ourl}"]', "--server.port", "0",
                            "--client.poll_interval", "0.05"], work / f"relay{i}.log")
            procs.append(p)
            relays.append(url)
        urls = json.dumps([ourl, *relays])
        logs = [work / f"client{i}.log" for i in range(args.clients)]
        for i in range(args.clients):
            clients.append(subprocess.Popen(
                [sys.executable, "-m", "meshrl.cli", "shardcast", "fetch", "--server.urls", urls,
                 "--version", "1", "--out", str(work / f"out{i}"), "--client.fsync", "false"],
                stdout=subprocess.PIPE, stderr=open(logs[i], "wb"), env=ENV))  # noqa: SIM115
        while not all('"fetch start"' in log.read_text() for log in logs):
            time.sleep(0.05)  # every client is up and waiting for version 1
        time.sleep(0.5)
        cpu0 = {p.pid: cpu_s(p.pid) for p in procs + clients}
        t0, own0 = time.perf_counter(), time.process_time()
        VersionStore(work / "origin").publish(src, 1, args.shard_mb * 1_000_000, link=args.link)
        t_pub = time.perf_counter() - t0
        cpu = time.process_time() - own0
        ends = []
        for c in clients:
            rc, used = wait_cpu(c)
            if rc:
                raise RuntimeError("a client failed")
            cpu += used - cpu0[c.pid]
            ends.append(time.perf_counter() - t0)
            if args.verbose:
                print("client cpu", round(used - cpu0[c.pid], 3), file=sys.stderr)
            if args.verbose:
                print(c.stdout.read().decode().strip(), round(ends[-1], 3), file=sys.stderr)
        wall = max(ends)
        cpu += sum(cpu_s(p.pid) - cpu0[p.pid] for p in procs)  # services, until now
        if args.verbose:
            print("publish cpu", round(time.process_time() - own0, 3), "services cpu",
                  [round(cpu_s(p.pid) - cpu0[p.pid], 3) for p in procs], file=sys.stderr)
        relay_health = [health(u) for u in relays]
        for i in range(args.clients):
            if not _same(work / f"out{i}", src):
                raise RuntimeError(f"client {i} holds a different file")
        deadline = time.time() + 60
        while time.time() < deadline and any("1" not in h.get("mirrored", {})
                                             for h in relay_health):
            time.sleep(0.2)
            relay_health = [health(u) for u in relays]
        return {"wall_s": wall, "publish_s": t_pub, "relays": relay_health, "cpu_s": cpu,
                "origin_bytes_sent": health(ourl)["counters"].get("bytes_sent", 0)}
    finally:
        for p in procs + clients:
            if p.returncode is None:
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
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--link", action="store_true", help="publish by hard link (no copy)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the services' logs in /tmp")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_shardcast_", dir="/tmp"))
    try:
        size = args.size_mb * 1_000_000
        src = work / "src" / "weights.bin"
        src.parent.mkdir()
        make_file(src, size)
        plain_s, plain_cpu = plain(work, src, args.clients)
        for i in range(args.clients):
            (work / f"plain{i}").unlink()
        t = tree(work, src, args)
        total = size * args.clients
        common = {"size_mb": args.size_mb, "clients": args.clients}
        print(json.dumps({"bench": "shardcast_plain_http", **common, "wall_s": round(plain_s, 3),
                          "aggregate_MBps": round(total / plain_s / 1e6, 1),
                          "cpu_s": round(plain_cpu, 3)}))
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
            "publish_link": args.link,
            "wall_s": round(t["wall_s"], 3), "publish_s": round(t["publish_s"], 3),
            "aggregate_MBps": round(tree_tp / 1e6, 1),
            "ratio": round(tree_tp / (total / plain_s), 3),
            "ratio_excluding_publish": round(plain_s / (t["wall_s"] - t["publish_s"]), 3),
            "cpu_s": round(t["cpu_s"], 3), "cpu_ratio": round(t["cpu_s"] / plain_cpu, 3),
            "origin_bytes_sent": t["origin_bytes_sent"], **pipelined,
        }))
    finally:
        if args.keep_logs:
            for p in work.iterdir():
                if not p.name.endswith(".log"):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
            print(json.dumps({"logs": str(work)}), file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
