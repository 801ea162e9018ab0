"""A whole pool on loopback for the worker / validator tests: anvil with the contracts, the
discovery and orchestrator services, a saved tiny policy, and `meshrl worker` / `meshrl validator`
processes started from TOML configs (keys from keystore files, the password in the env)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.protocol import Protocol, ProtocolParams, WorkStatus, deploy
from meshrl.protocol.anvil import AnvilNode
from meshrl.wire import SignedClient
from meshrl.wire.models import LedgerPage, StepUpdate
from meshrl.worker.keys import write_keystore
from orchestrator.net import LAUNCHER, SRC, Service, write_toml

TOKEN = 10**18
PARAMS = ProtocolParams(min_stake=100 * TOKEN, stake_per_unit=10 * TOKEN, unbonding_delay=7200,
                        invalidation_window=3600, lock_period=7200, slash_penalty=50 * TOKEN,
                        verdict_bond=0, dispute_period=0)  # verdicts final at once
PASSWORD = "correct horse"
# the pool's public rules: the orchestrator publishes them ([rules]), validators and workers may
# pin them ([rules]: each pin must equal the published value); every worker runs meshrl's CPU
# engine, so the tight proof profile that sees int8 / scale-layer in these 8-chunk files
RULES: dict[str, Any] = {
    "async_level": 2, "seed": 11, "prompts_per_file": 2, "proof_profile": "meshrl-cpu-engine",
    "task": {"mix": [{"type": "arithmetic", "digits": 2, "operators": "+-"}]},
    "sampling": {"max_new_tokens": 16, "temperature": 1.0, "top_p": 1.0}, "group_size": 4,
}


def key(label: str) -> LocalAccount:
    return Account.from_key(keccak(text=f"meshrl-roles-{label}"))


def hexkey(a: LocalAccount) -> str:
    return "0x" + bytes(a.key).hex()


@dataclass
class Net:
    tmp: Path
    anvil: AnvilNode
    fed: Protocol
    pool: int
    deployment: Path
    model_dir: Path
    disc: Service | None = None
    orch: Service | None = None
    procs: list[Service] = field(default_factory=list)

    def client(self, who: LocalAccount) -> Protocol:
        return self.fed.as_(who)

    def close(self) -> None:
        for s in [*self.procs, self.orch, self.disc]:
            if s is not None:
                s.stop()
        self.anvil.stop()


def start_net(tmp: Path, orch: dict[str, Any] | None = None, params: ProtocolParams = PARAMS,
              **discovery: Any) -> Net:
    """The pool; `discovery`: settings of the discovery service over the defaults; `orch`:
    top-level keys of the orchestrator's config, replaced; `params`: the deployment's."""
    anvil = AnvilNode()
    backend = anvil.start()
    fed, mgr, val = key("fed"), key("mgr"), key("val")
    for a in (fed, mgr, val):
        backend.fund(a.address, 10**21)
    dep = deploy(backend, fed, params)
    path = tmp / "deployment.json"
    dep.save(path)
    chain = Protocol(backend, dep, fed)
    chain.set_validator(val.address)
    pool = chain.create_pool(chain.create_domain("arith"), mgr.address, 10**15)
    chain.start_pool(pool)
    tok = CharTokenizer()
    model_dir = save_model(build_model("qwen2-tiny", tok.vocab_size, seed=3), tok,
                           tmp / "policy-v0")
    net = Net(tmp, anvil, chain, pool, path, model_dir)
    chain_cfg = {"deployment": str(path), "rpc_url": anvil.url}
    net.disc = Service("discovery", {"port": 0, "db": str(tmp / "disc.db"), "sync_s": 0.5,
                                     "manager_cache_s": 0.0, "chain": chain_cfg, **discovery}, tmp)
    net.disc.start()
    work = {"step": 0, "max_units_per_file": 100_000, "slot_ttl_s": 20.0}
    net.orch = Service("orchestrator", {
        "port": 0, "pool_id": pool, "db": str(tmp / "orch.db"), "chain_poll_s": 0.3,
        "validator_cache_s": 0.0, "chain": {**chain_cfg, "private_key": hexkey(mgr)},
        "guard": {"rate_per_minute": 6000, "rate_burst": 200},
        "store": {"root": str(tmp / "files")},
        "heartbeat": {"interval_s": 2.0, "dead_after": 5000},  # finished workers stay members
        "onboarding": {"poll_s": 0.3, "discovery_url": net.disc.url}, "work": work,
        "rules": RULES, **(orch or {})}, tmp)
    net.orch.start()
    return net


def fund_provider(net: Net, label: str) -> tuple[LocalAccount, LocalAccount, Path]:
    """Provider and node accounts with gas and tokens, and their keystores under tmp/keys."""
    p, n = key(f"{label}-provider"), key(f"{label}-node")
    net.fed.backend.fund(p.address, 10**21)
    net.fed.backend.fund(n.address, 10**21)
    net.fed.mint(p.address, 1_000 * TOKEN)
    d = net.tmp / "keys" / label
    write_keystore(p, PASSWORD, d / "provider.json", iterations=2)
    write_keystore(n, PASSWORD, d / "node.json", iterations=2)
    return p, n, d


class Role(Service):
    """A `meshrl worker` / `meshrl validator` process (no ready file: it runs until done)."""

    def __init__(self, role: str, name: str, cfg: dict[str, Any], tmp: Path) -> None:
        self.role, self.tmp, self.name = role, tmp, name
        self.config = write_toml(tmp / f"{name}.toml", cfg)
        self.log = tmp / f"{name}.log"
        self.proc = None
        self.url = ""

    def start(self, timeout: float = 0.0) -> str:
        env = {**os.environ, "PYTHONPATH": str(SRC), "MESHRL_KEYSTORE_PASSWORD": PASSWORD}
        self.proc = LAUNCHER.start([sys.executable, "-m", "meshrl.cli", *self.role.split(),
                                    str(self.config)], self.log, env)
        return ""

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} still running after {timeout}s:\n"
                               f"{self.log.read_text()[-4000:]}") from None


def worker(net: Net, name: str, cheat: dict[str, Any] | None = None, max_files: int = 1,
           **over: Any) -> Role:
    keys = net.tmp / "keys" / name
    cfg = {"pool_id": net.pool, "orchestrator_url": net.orch.url,
           "discovery_url": net.disc.url, "work_dir": str(net.tmp / f"w-{name}"),
           "model_dir": str(net.model_dir), "max_files": max_files, "poll_interval": 0.3,
           "heartbeat_interval": 1.0,
           "keys": {"provider_keystore": str(keys / "provider.json"),
                    "node_keystore": str(keys / "node.json")},
           "chain": {"deployment": str(net.deployment), "rpc_url": net.anvil.url},
           "engine": {"num_threads": 1}, "cheat": cheat or {"mode": "none"}, **over}
    honest = (cheat or {"mode": "none"})["mode"] == "none"  # a cheat runs as an adversary
    r = Role("worker" if honest else "adversary worker", f"worker-{name}", cfg, net.tmp)
    net.procs.append(r)
    return r


def validator(net: Net, max_files: int = 0, name: str = "validator", **over: Any) -> Role:
    d = net.tmp / "keys" / "validator"
    if not (d / "key.json").is_file():
        write_keystore(key("val"), PASSWORD, d / "key.json", iterations=2)
    cfg = {"pool_id": net.pool, "orchestrator_url": net.orch.url,
           "work_dir": str(net.tmp / "validator"), "model_dir": str(net.model_dir),
           "poll_interval": 0.3, "max_files": max_files,
           "keys": {"keystore": str(d / "key.json")},
           "chain": {"deployment": str(net.deployment), "rpc_url": net.anvil.url},
           "rules": dict(RULES), "engine": {"num_threads": 1},
           "retry": {"backoff": 0.5, "max_attempts": 4}, **over}
    r = Role("validator", name, cfg, net.tmp)
    net.procs.append(r)
    return r


def wait_until(check: Any, timeout: float, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if out:
            return out
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(every)


# ---- reading the pool: chain events and the orchestrator's ledger ----------------------------
def _works(net: Net, node: str) -> list:
    """(work id, WorkInfo) of every submission by `node`."""
    out = []
    for e in net.fed.events(net.fed.deployment.block).poll():
        if e.name == "WorkSubmitted" and e.args["node"].lower() == node.lower():
            wid = bytes(e.args["work_id"])
            out.append((wid, net.fed.work(wid)))
    return out


def _rows(net: Net) -> list:
    async def read() -> LedgerPage:
        async with SignedClient(net.orch.url, "0x" + bytes(key("mgr").key).hex()) as c:
            return await c.call("GET", "/ledger", response=LedgerPage, query={"limit": 5000})
    return asyncio.run(read()).entries


def _ledger(net: Net) -> dict[str, str]:
    """The status of each file's granted row (a copy submitted by another node has its own)."""
    return {e.sha256: e.status.value for e in _rows(net) if e.granted}


def _set_step(net: Net, step: int) -> None:
    async def go() -> None:
        async with SignedClient(net.orch.url, "0x" + bytes(key("mgr").key).hex()) as c:
            await c.call("POST", "/step", StepUpdate(step=step))
    asyncio.run(go())


def _status(net: Net, node: str) -> list[int]:
    return [w.status for _, w in _works(net, node)]


def _hard(net: Net, node: str, n: int = 1):
    """Until `node` has n hard-invalidated submissions."""
    return lambda: _status(net, node).count(WorkStatus.HARD_INVALIDATED) >= n


def _accepted(net: Net, node: str, n: int = 1):
    """Until the orchestrator's ledger has n accepted files of `node`."""
    def check() -> bool:
        shas = {bytes(e.args["file_sha256"]).hex() for e in net.fed.events(
            net.fed.deployment.block).poll() if e.name == "WorkSubmitted" and
            e.args["node"].lower() == node.lower()}
        return sum(_ledger(net).get(s) == "accepted" for s in shas) >= n
    return check
