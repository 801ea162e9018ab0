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
import shutil
import statistics
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
                 "--version", "1", "--out", str(work / f"out{i}"), "--client.fsync", "false",
                 *args.client_args],
                stdout=subprocess.PIPE, stderr=open(logs[i], "wb"), env=ENV))  # noqa: SIM115
        while not all('"fetch start"' in log.read_text() for log in logs):
            time.sleep(0.05)  # every client is up and waiting for version 1
        time.sleep(0.5)
        cpu0 = {p.pid: cpu_s(p.pid) for p in procs + clients}
        t0, own0 = time.perf_counter(), time.process_time()
        VersionStore(work / "origin").publish(src, 1, args.shard_mb * 1_000_000, link=args.link)
        t_pub = time.perf_counter() - t0
        publish_cpu = time.process_time() - own0
        ends, client_cpu = [], 0.0
        for c in clients:
            rc, used = wait_cpu(c)
            if rc:
                raise RuntimeError("a client failed")
            client_cpu += used - cpu0[c.pid]
            ends.append(time.perf_counter() - t0)
            if args.verbose:
                print(c.stdout.read().decode().strip(), round(ends[-1], 3), "cpu",
                      round(cpu0[c.pid], 3), round(used, 3), file=sys.stderr)
        wall = max(ends)
        services = [cpu_s(p.pid) - cpu0[p.pid] for p in procs]  # until now
        relay_health = [health(u) for u in relays]
        for i in range(args.clients):
            if not _same(work / f"out{i}", src):
                raise RuntimeError(f"client {i} holds a different file")
        deadline = time.time() + 60
        while time.time() < deadline and any("1" not in h.get("mirrored", {})
                                             for h in relay_health):
            time.sleep(0.2)
            relay_health = [health(u) for u in relays]
        return {"wall_s": wall, "publish_s": t_pub, "relays": relay_health,
                "publish_cpu_s": publish_cpu, "client_cpu_s": client_cpu,
                "origin_cpu_s": services[0], "relay_cpu_s": sum(services[1:]),
                "origin_bytes_sent": health(ourl)["counters"].get("bytes_sent", 0)}
    finally:
        for p in procs + clients:
            if p.returncode is None:
                p.kill()
                p.wait()
        for d in ["origin", *(f"relay{i}" for i in range(args.relays)),
                  *(f"out{i}" for i in range(args.clients))]:
            shutil.rmtree(work / d, ignore_errors=True) if (work / d).is_dir() else (
                (work / d).unlink(missing_ok=True))


def _same(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and _sha(a) == _sha(b)


def _sha(p: Path) -> str:
    from meshrl.shardcast.manifest import sha256_file

    return sha256_file(p)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


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
            "load_before": load, "load_after": _load()}
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
        "load_before": load, "load_after": _load(),
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
    work = Path(tempfile.mkdtemp(prefix="bench_shardcast_", dir="/tmp"))
    try:
        src = work / "src" / "weights.bin"
        src.parent.mkdir()
        make_file(src, args.size_mb * 1_000_000)
        ratios = []
        for rnd in range(args.rounds):
            order = ["plain", "tree"] if rnd % 2 == 0 else ["tree", "plain"]
            got: dict[str, tuple[dict, float]] = {}
            for kind in order:
                _settle()
                load = _load()
                got[kind] = (plain(work, src, args.clients) if kind == "plain"
                             else tree(work, src, args), load)
            p_line = report_plain(args, rnd, *got["plain"])
            t_line = report_tree(args, rnd, got["tree"][0], p_line, got["tree"][1])
            ratios.append(t_line["ratio"])
        print(json.dumps({"bench": "shardcast_summary", "size_mb": args.size_mb,
                          "rounds": args.rounds, "ratios": ratios,
                          "ratio_median": round(statistics.median(ratios), 3), "goal": 0.8,
                          "load_after": _load()}))
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
