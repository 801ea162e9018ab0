"""A real pool network for service tests: anvil with the contracts deployed, the actors' keys,
and `meshrl discovery` / `meshrl orchestrator` as separate processes on loopback.

Actors: federator, manager (the orchestrator's key), validator, trainer (a ledger reader),
stranger; providers p1 (nodes n1..n4) and p2 (node n5); all nodes added on chain, none in a pool.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from meshrl.network.launcher import RoleLauncher, RoleProcess
from meshrl.protocol import Protocol, ProtocolParams, deploy
from meshrl.protocol.anvil import AnvilNode
from meshrl.wire import SignedClient, WireHTTPError
from meshrl.wire.models import Hardware, Heartbeat, Invite, NodeAnnouncement

TOKEN = 10**18
SRC = Path(__file__).resolve().parents[2] / "src"
# roles forked from this test process's preloaded server, as `network up` starts them: each is
# still its own process (pid, session, signals, exit code), without ~2.5 CPU-s of imports
LAUNCHER = RoleLauncher()
PARAMS = ProtocolParams(min_stake=100 * TOKEN, stake_per_unit=10 * TOKEN,
                        invalidation_window=3600, lock_period=7200, slash_penalty=50 * TOKEN,
                        verdict_bond=0, dispute_period=0)  # verdicts final at once


def key(label: str) -> LocalAccount:
    return Account.from_key(keccak(text=f"meshrl-services-{label}"))


def hexkey(acct: LocalAccount) -> str:
    return "0x" + bytes(acct.key).hex()


@dataclass
class Chain:
    node: AnvilNode
    fed: Protocol
    pool: int
    deployment: Path
    accounts: dict[str, LocalAccount] = field(default_factory=dict)

    def client(self, name: str) -> Protocol:
        return self.fed.as_(self.accounts[name])

    def close(self) -> None:
        self.node.stop()


def start_chain(tmp: Path) -> Chain:
    node = AnvilNode()
    backend = node.start()
    names = ["fed", "mgr", "val", "trainer", "stranger", "p1", "p2"]
    names += [f"n{i}" for i in range(1, 6)]
    accts = {n: key(n) for n in names}
    for a in accts.values():
        backend.fund(a.address, 10**21)
    dep = deploy(backend, accts["fed"], PARAMS)
    path = tmp / "deployment.json"
    dep.save(path)
    fed = Protocol(backend, dep, accts["fed"])
    fed.set_validator(accts["val"].address)
    domain = fed.create_domain("math")
    pool = fed.create_pool(domain, accts["mgr"].address, 10**15)
    fed.start_pool(pool)
    chain = Chain(node, fed, pool, path, accts)
    for prov, nodes in (("p1", ["n1", "n2", "n3", "n4"]), ("p2", ["n5"])):
        fed.mint(accts[prov].address, 10_000 * TOKEN)
        p = chain.client(prov)
        p.register_provider(1000 * TOKEN)
        for n in nodes:
            p.add_node(accts[n], 2)
    return chain


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def write_toml(path: Path, cfg: dict[str, Any]) -> Path:
    lines, tables = [], []
    for k, v in cfg.items():
        (tables if isinstance(v, dict) else lines).append((k, v))
    out = [f"{k} = {_toml(v)}" for k, v in lines]
    for name, table in tables:
        out.append(f"\n[{name}]")
        out.extend(f"{k} = {_toml(v)}" for k, v in table.items())
    path.write_text("\n".join(out) + "\n")
    return path


def stop_process(proc: RoleProcess | None) -> None:
    """SIGINT (a clean shutdown), then SIGKILL after 10 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Service:
    """One `meshrl <role>` process; `url` once it wrote its ready file."""

    def __init__(self, role: str, cfg: dict[str, Any], tmp: Path) -> None:
        self.role, self.tmp = role, tmp
        self.ready = tmp / f"{role}.ready"
        cfg = {**cfg, "ready_file": str(self.ready)}
        self.config = write_toml(tmp / f"{role}.toml", cfg)
        self.log = tmp / f"{role}.log"
        self.proc: RoleProcess | None = None
        self.url = ""

    def start(self, timeout: float = 90.0) -> str:  # imports alone took >30 s at load 20
        self.ready.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        self.proc = LAUNCHER.start([sys.executable, "-m", "meshrl.cli", self.role,
                                    str(self.config)], self.log, env)
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.role} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        self.url = self.ready.read_text()
        return self.url

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def announcement(chain: Chain, provider: str, cores: int = 8, gpus: int = 0) -> NodeAnnouncement:
    hw = Hardware(cores=cores, memory_gb=32, accelerators=(
        [{"name": "H100", "memory_gb": 80, "count": gpus}] if gpus else []))
    return NodeAnnouncement(provider=chain.accounts[provider].address, pool_id=chain.pool,
                            endpoints=[], hardware=hw, software={"meshrl": "0.1.0"})


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float = 20.0,
                   every: float = 0.1) -> Any:
    """Call `check` until it returns a truthy value (WireHTTPError counts as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            out = await check()
            if out:
                return out
        except WireHTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(every)


async def onboard(chain: Chain, disc: str, orch: str, node: str, provider: str) -> None:
    """Announce, fetch the invite, join on chain, wait until the orchestrator knows it."""
    k = hexkey(chain.accounts[node])
    async with SignedClient(disc, k) as d, SignedClient(orch, k) as o:
        await d.call("PUT", "/nodes", announcement(chain, provider))
        inv = await wait_for(lambda: o.call("GET", "/invite", response=Invite))
        me = chain.client(node)
        await asyncio.to_thread(me.join_pool, inv.pool_id, me.address, inv.nonce, inv.expiry,
                                bytes.fromhex(inv.signature[2:]))
        await wait_for(lambda: o.call("POST", "/heartbeat", Heartbeat()))


class Heartbeater:
    """Keeps some nodes heartbeating from a background thread (its own event loop), each
    naming policy version `version` (set it to move them on)."""

    def __init__(self, url: str, keys: list[str], every: float, version: int = 0) -> None:
        self.url, self.keys, self.every, self.version = url, keys, every, version
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        clients = [SignedClient(self.url, k) for k in self.keys]
        try:
            while not self._stop.is_set():
                for c in clients:
                    try:
                        await c.call("POST", "/heartbeat",
                                     Heartbeat(policy_version=self.version, step=self.version))
                    except (WireHTTPError, aiohttp.ClientError, OSError) as e:
                        self.errors.append(f"{c.address}: {e}")
                await asyncio.sleep(self.every)
        finally:
            for c in clients:
                await c.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


async def candidate_listings(discovery_url: str) -> int:
    """How many candidate lists (`GET /pools/{pool_id}/nodes`) discovery has served: the
    orchestrator asks for one per onboarding pass."""
    async with aiohttp.ClientSession() as s, s.get(discovery_url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if (line.startswith("meshrl_http_requests_total{") and 'status="200"' in line
                and 'route="/pools/{pool_id}/nodes"' in line):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def at_least(count: Awaitable[int], n: int) -> bool:
    return (await count) >= n
