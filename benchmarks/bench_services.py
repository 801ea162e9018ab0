"""Load on one orchestrator process: N simulated nodes heartbeating every I seconds plus rounds
of U concurrent uploads of S MB, every request signed and verified, on loopback against anvil.

Set-up (not timed): anvil, the contracts, one pool, 10 providers whose N nodes join the pool on
chain with the manager's invites (the orchestrator learns them from `NodeJoined`). Then the load
runs for `--duration` seconds: each node heartbeats with its own key at a random phase; upload
rounds (grant a slot, stream the file) start every `--duration / (rounds + 1)` seconds. Prints
one JSON object per line:

  heartbeat   p50 / p99 / max latency (ms), requests, errors
  uploads     MB/s of each round (bytes of the round / wall time of the round) and overall
  cpu         orchestrator CPU seconds / wall seconds (1.0 = one core busy)
  signatures  server-side cost per request (us) of signature recovery and its share of CPU
  records     heartbeats acknowledged vs recorded, uploads acknowledged vs in the ledger and on
              disk with their sha256: lost and duplicated must be 0

`--crash` kills the orchestrator with SIGKILL halfway through (mid-upload), restarts it on the
same port and keeps the load going for `dead_after + 1` heartbeat intervals: every acknowledged
upload must be in the ledger and on disk, and no node may be ejected.

    python benchmarks/bench_services.py [--nodes 1000] [--interval 10] [--duration 60]
        [--uploads 20] [--upload-mb 10] [--rounds 3] [--crash]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

import aiohttp  # noqa: E402
from eth_account import Account  # noqa: E402
from eth_utils import keccak  # noqa: E402

from meshrl.protocol import Protocol, ProtocolParams, deploy  # noqa: E402
from meshrl.protocol.anvil import AnvilNode  # noqa: E402
from meshrl.wire import SignedClient, WireHTTPError, recover_signer, sign_request  # noqa: E402
from meshrl.wire.models import Heartbeat, SlotRequest, UploadSlot  # noqa: E402
from meshrl.wire.signing import request_message  # noqa: E402

TOKEN = 10**18
NET_ERRORS = (WireHTTPError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def emit(**row: Any) -> None:
    print(json.dumps({"bench": "services", **row}), flush=True)


def acct(label: str) -> Any:
    return Account.from_key(keccak(text=f"bench-services-{label}"))


def setup_chain(n_nodes: int, tmp: Path) -> tuple[AnvilNode, Protocol, int, list[Any], Any]:
    """anvil + contracts + an active pool whose manager is `mgr`; n nodes joined (by provider)."""
    anvil = AnvilNode()
    backend = anvil.start()
    fed, mgr = acct("fed"), acct("mgr")
    providers = [acct(f"p{i}") for i in range(10)]
    for a in (fed, mgr, *providers):
        backend.fund(a.address, 10**22)
    params = ProtocolParams(min_stake=10 * TOKEN, stake_per_unit=TOKEN)
    dep = deploy(backend, fed, params)
    dep.save(tmp / "deployment.json")
    F = Protocol(backend, dep, fed)
    domain = F.create_domain("bench")
    pool = F.create_pool(domain, mgr.address, 10**12)
    F.start_pool(pool)
    nodes = [acct(f"n{i}") for i in range(n_nodes)]

    for p in providers:  # the federator's transactions, in nonce order
        F.mint(p.address, 10_000 * TOKEN)

    def provider_work(i: int) -> None:  # one thread per provider: its own nonces
        p = F.as_(providers[i])
        p.register_provider(5_000 * TOKEN)
        m = F.as_(mgr)
        for n in nodes[i::len(providers)]:
            p.add_node(n, 1)  # signs the ownership proof for the node's current generation
            expiry = int(time.time()) + 3600
            p.join_pool(pool, n.address, 1, expiry, m.sign_invite(pool, n.address, 1, expiry))
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(providers)) as ex:
        list(ex.map(provider_work, range(len(providers))))
    emit(phase="setup", nodes=n_nodes, seconds=round(time.monotonic() - t0, 1))
    return anvil, F, pool, nodes, mgr


class Orchestrator:
    def __init__(self, tmp: Path, anvil: AnvilNode, pool: int, mgr: Any, a: Any) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.tmp, self.ready = tmp, tmp / "orch.ready"
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = tmp / "orch.db"
        self.files = tmp / "files"
        self.config = tmp / "orch.toml"
        self.config.write_text(f"""
port = {self.port}
pool_id = {pool}
db = "{self.db}"
ready_file = "{self.ready}"
readers = ["{mgr.address}"]
[chain]
deployment = "{tmp / 'deployment.json'}"
rpc_url = "{anvil.url}"
private_key = "0x{bytes(mgr.key).hex()}"
[guard]
rate_per_minute = 600
[store]
root = "{self.files}"
[heartbeat]
interval_s = {a.interval}
dead_after = {a.dead_after}
[work]
max_file_bytes = {a.upload_mb << 21}
slot_ttl_s = 3600
""")
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_before = 0.0

    def start(self) -> None:
        self.ready.unlink(missing_ok=True)
        log = (self.tmp / "orch.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "meshrl.cli", "orchestrator", str(self.config)],
            stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(SRC)})
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError((self.tmp / "orch.log").read_text()[-3000:])
            time.sleep(0.05)

    def cpu(self) -> float:
        """CPU seconds (user + system) of the running process."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:  # a busy machine: the numbers are in already
                emit(phase="stop", note="orchestrator did not stop in 60 s: killed")
                self.kill9()


async def _heartbeats(url: str, keys: list[str], interval: float, stop_rel: float,
                      t0: float) -> dict:
    """Each key heartbeats every `interval` s from a random phase until `t0 + stop_rel`."""
    stop_at = t0 + stop_rel
    lat: list[float] = []
    acked: dict[str, int] = {}
    errors = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def node(key: str) -> None:
            nonlocal errors
            c = SignedClient(url, key, session=session)
            acked[c.address] = 0
            await asyncio.sleep(random.random() * interval)
            body = Heartbeat(policy_version=0, step=0, tokens_per_s=100.0)
            while time.time() < stop_at:
                t0 = time.perf_counter()
                try:
                    await c.call("POST", "/heartbeat", body)
                    lat.append(time.perf_counter() - t0)
                    acked[c.address] += 1
                except NET_ERRORS:
                    errors += 1
                await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        await asyncio.gather(*(node(k) for k in keys))
    return {"latencies": lat, "acked": acked, "errors": errors}


async def _uploads(url: str, jobs: list[list[tuple[str, str, str]]], starts_rel: list[float],
                   t0: float) -> dict:
    """Round k starts at `t0 + starts_rel[k]`; it uploads its (key, path, sha256) at once."""
    starts = [t0 + s for s in starts_rel]
    rounds, acked = [], {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def one(key: str, path: str, sha: str, counter: int) -> int:
            c = SignedClient(url, key, session=session)
            size = Path(path).stat().st_size
            try:
                slot = await c.call("POST", "/uploads", SlotRequest(
                    sha256=sha, size=size, policy_version=0, work_units=1,
                    counter=counter),
                    response=UploadSlot)
                await c.upload("PUT", slot.url, path, sha)
            except NET_ERRORS:
                return 0
            acked[sha] = size
            return size
        for k, (jobs_k, at) in enumerate(zip(jobs, starts, strict=True)):
            await asyncio.sleep(max(0.0, at - time.time()))
            t0 = time.perf_counter()
            # a node uploads at most once a round: round k is its counter k
            done = await asyncio.gather(*(one(*job, k) for job in jobs_k))
            rounds.append({"round": k, "bytes": sum(done), "seconds": time.perf_counter() - t0,
                           "ok": sum(1 for d in done if d)})
    return {"rounds": rounds, "acked": acked}


def _child(fn_name: str, args: tuple, out: str) -> None:
    """Entry of a load process (spawned): say it is ready, wait for the start time (seconds
    from then, in `<out>.go`), run one load function, write its result as JSON."""
    random.seed(os.getpid())
    Path(out + ".ready").touch()
    go = Path(out + ".go")
    while not go.exists():
        time.sleep(0.05)
    result = asyncio.run(globals()[fn_name](*args, t0=float(go.read_text())))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = ru.ru_utime + ru.ru_stime
    Path(out).write_text(json.dumps(result))


def make_upload_files(a: Any, nodes: list[Any], tmp: Path) -> list[list[tuple[str, str, str]]]:
    """Every round's files, written and hashed before the load starts (not timed)."""
    jobs = []
    for k in range(a.rounds):
        who = random.sample(nodes, a.uploads)
        round_jobs = []
        for i, n in enumerate(who):
            data = b"PAR1" + os.urandom((a.upload_mb << 20) - 12)  # framed as Parquet
            data += ((a.upload_mb << 20) - 12).to_bytes(4, "little") + b"PAR1"
            path = tmp / f"up-{k}-{i}"
            path.write_bytes(data)
            round_jobs.append(("0x" + bytes(n.key).hex(), str(path),
                               hashlib.sha256(data).hexdigest()))
        jobs.append(round_jobs)
    return jobs


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


async def wait_members(orch: Orchestrator, reader: Any, n: int) -> None:
    async with SignedClient(orch.url, reader.key) as c:
        while True:
            got = await c.call("GET", "/health")
            if got["info"]["nodes"]["healthy"] >= n:
                return
            await asyncio.sleep(0.5)


def spawn_clients(a: Any, orch: Orchestrator, nodes: list[Any], tmp: Path,
                  jobs: list[list[tuple[str, str, str]]]) -> tuple[Any, Any, float, list[float]]:
    """Heartbeats and uploads in two spawned processes (so neither's client work delays the
    other's timing), started and imported before the orchestrator learns of any node: a slow
    start on a busy machine must not look like dead nodes. They wait for `go` files."""
    ctx = mp.get_context("spawn")
    extra = (a.dead_after + 1) * a.interval if a.crash else 0.0
    gap = a.duration / (a.rounds + 1)
    # times are relative to the start, which the children learn once both are ready
    stop_rel, starts_rel = a.duration + extra, [gap * (k + 1) for k in range(a.rounds)]
    keys = ["0x" + bytes(n.key).hex() for n in nodes]
    hb = ctx.Process(target=_child, args=("_heartbeats", (orch.url, keys, a.interval, stop_rel),
                                          str(tmp / "hb.json")))
    up = ctx.Process(target=_child, args=("_uploads", (orch.url, jobs, starts_rel),
                                          str(tmp / "up.json")))
    hb.start()
    up.start()
    while not all((tmp / f"{n}.json.ready").exists() for n in ("hb", "up")):
        time.sleep(0.05)
    return hb, up, stop_rel, starts_rel


def run_load(a: Any, orch: Orchestrator, reader: Any, tmp: Path,
             jobs: list[list[tuple[str, str, str]]], clients: tuple) -> dict[str, Any]:
    """Start the clients' clock, crash the orchestrator if asked, collect the results."""
    hb, up, stop_rel, starts_rel = clients
    t_start = time.time() + 0.2
    for n in ("hb", "up"):
        (tmp / f"{n}.json.go").write_text(repr(t_start))
    stop_at, starts = t_start + stop_rel, [t_start + s for s in starts_rel]
    time.sleep(max(0.0, t_start - time.time()))
    cpu0, wall0, out = orch.cpu(), time.monotonic(), {}
    if a.crash:
        mid = a.rounds // 2
        time.sleep(max(0.0, starts[mid] + 0.5 - time.time()))  # mid-upload
        cpu_before = orch.cpu() - cpu0
        orch.kill9()
        t_kill = time.monotonic()
        orch.start()
        out["downtime_s"] = round(time.monotonic() - t_kill, 2)
        emit(phase="crash", downtime_s=out["downtime_s"])
        cpu0 = orch.cpu() - cpu_before
    time.sleep(max(0.0, stop_at - 1.0 - time.time()))
    out["health"], out["server_hb"] = asyncio.run(_health(orch, reader))
    out["cpu"], out["wall"] = orch.cpu() - cpu0, time.monotonic() - wall0
    hb.join()
    up.join()
    out["hb"] = json.loads((tmp / "hb.json").read_text())
    out["up"] = json.loads((tmp / "up.json").read_text())
    for round_jobs in jobs:
        for _, path, _ in round_jobs:
            Path(path).unlink()
    return out


async def _health(orch: Orchestrator, reader: Any) -> tuple[dict[str, Any], dict[str, float]]:
    """/health, and the server's own heartbeat latency from its Prometheus histogram."""
    async with SignedClient(orch.url, reader.key) as c:
        info = (await c.call("GET", "/health"))["info"]
        async with c.session.get(orch.url + "/metrics") as r:
            text = await r.text()
    buckets = []
    for line in text.splitlines():
        if line.startswith("meshrl_http_request_seconds_bucket") and '"/heartbeat"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0.0

    def q(p: float) -> float:  # upper bound of the bucket holding quantile p (ms)
        return next((le * 1e3 for le, n in buckets if n >= p * total), float("inf"))
    frac100 = next((n / total for le, n in buckets if abs(le - 0.1) < 1e-9), 0.0) if total else 0
    return info, {"p50_le_ms": q(0.5), "p99_le_ms": q(0.99), "share_le_100ms": round(frac100, 4)}


def check_records(out: dict[str, Any], orch: Orchestrator) -> dict[str, Any]:
    db = sqlite3.connect(orch.db)
    hb = dict(db.execute("SELECT address, heartbeats FROM nodes"))
    acked_hb, acked_up = out["hb"]["acked"], out["up"]["acked"]
    lost_hb = sum(max(0, n - hb.get(addr, 0)) for addr, n in acked_hb.items())
    extra_hb = sum(max(0, hb.get(addr, 0) - n) for addr, n in acked_hb.items())
    files = dict(db.execute("SELECT sha256, status FROM files"))
    lost_up = 0
    for sha, size in acked_up.items():
        path = orch.files / sha[:2] / f"{sha}.parquet"
        ok = files.get(sha) == "uploaded" and path.is_file() and path.stat().st_size == size
        lost_up += not (ok and hashlib.sha256(path.read_bytes()).hexdigest() == sha)
    on_disk = sum(1 for p in orch.files.rglob("*.parquet"))
    return {"heartbeats_acked": sum(acked_hb.values()), "heartbeats_lost": lost_hb,
            "heartbeats_recorded_unacked": extra_hb, "uploads_acked": len(acked_up),
            "uploads_lost": lost_up, "files_on_disk": on_disk,
            "ledger_rows_uploaded": sum(1 for v in files.values() if v == "uploaded")}


def signature_micro(n: int = 2000) -> float:
    """Client-independent cost of one signature recovery in this process (us)."""
    k = "0x" + "11" * 32
    h = sign_request(k, "POST", "/heartbeat", b"{}")
    msg = request_message("POST", "/heartbeat", h.body_sha256, h.nonce, h.timestamp)
    sig = bytes.fromhex(h.signature[2:])
    t0 = time.perf_counter()
    for _ in range(n):
        recover_signer(msg, sig)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--dead-after", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--uploads", type=int, default=20)
    ap.add_argument("--upload-mb", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, db)")
    a = ap.parse_args()
    random.seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-services-"))
    emit(phase="start", load=os.getloadavg(), **{k: v for k, v in vars(a).items()})
    anvil, F, pool, nodes, mgr = setup_chain(a.nodes, tmp)
    orch = Orchestrator(tmp, anvil, pool, mgr, a)
    jobs = make_upload_files(a, nodes, tmp)
    clients = spawn_clients(a, orch, nodes, tmp, jobs)
    try:
        orch.start()
        asyncio.run(wait_members(orch, mgr, a.nodes))
        out = run_load(a, orch, mgr, tmp, jobs, clients)
    finally:
        orch.stop()
    lat = out["hb"]["latencies"]
    emit(metric="heartbeat", requests=len(lat), errors=out["hb"]["errors"],
         p50_ms=round(pct(lat, 0.5), 2), p99_ms=round(pct(lat, 0.99), 2),
         max_ms=round(max(lat) * 1e3, 2), mean_ms=round(statistics.mean(lat) * 1e3, 2),
         server=out["server_hb"])
    rounds = out["up"]["rounds"]
    total = sum(r["bytes"] for r in rounds)
    emit(metric="uploads", rounds=[{**r, "seconds": round(r["seconds"], 2),
                                    "MB_s": round(r["bytes"] / r["seconds"] / 2**20, 1)}
                                   for r in rounds],
         MB_s=round(total / sum(r["seconds"] for r in rounds) / 2**20, 1))
    emit(metric="cpu", orchestrator_cpu_s=round(out["cpu"], 2), wall_s=round(out["wall"], 1),
         cores_busy=round(out["cpu"] / out["wall"], 3),
         heartbeat_clients_cpu_s=round(out["hb"]["cpu_s"], 2),
         upload_clients_cpu_s=round(out["up"]["cpu_s"], 2))
    sig = out["health"]["signatures"]
    per = sig["seconds"] / max(1, sig["verified"])
    emit(metric="signatures", verified=sig["verified"], server_us_per_request=round(per * 1e6, 1),
         micro_us=round(signature_micro(), 1),
         share_of_orchestrator_cpu=round(sig["seconds"] / max(out["cpu"], 1e-9), 4))
    rec = check_records(out, orch)
    ejected = [e for e in F.events(0).poll() if e.name == "NodeEjected"]
    emit(metric="records", **rec, ejected_on_chain=len(ejected),
         node_states_at_end=out["health"]["nodes"])
    emit(phase="end", load=os.getloadavg(), workdir=str(tmp) if a.keep else "")
    anvil.stop()
    if not a.keep:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
