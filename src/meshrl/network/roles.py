"""Every role of a local network as a command line and a config file it reads.

The pool's rules are written once (`PoolSpec`) into the orchestrator's `[rules]` (what it
publishes), the `[rules]` pins of the validator and every worker (each refuses to start if the
published rules differ) and the trainer's rollout shape.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshrl.network.config import NetworkConfig
from meshrl.network.keys import PoolKeys, select_keys
from meshrl.network.toml import write_toml
from meshrl.pool.rules import policy_run

__all__ = ["Layout", "RoleSpec", "build_roles", "find_anvil", "validator_name", "validator_names"]

CHAIN_ID = 31337
RPC_FILTER = 14  # port offset of the public chain RPC (a filter in front of anvil)
DASHBOARD = 15  # port offset of the dashboard
LOCAL = (0, DASHBOARD)  # anvil and the dashboard never leave loopback


def find_anvil(explicit: str = "") -> str:
    """`explicit` if given (it must exist), else node_modules/.bin/anvil, else PATH."""
    cands = [explicit] if explicit else [str(Path("node_modules/.bin/anvil")),
                                         shutil.which("anvil") or ""]
    for cand in cands:
        if cand and Path(cand).is_file():
            return cand
    where = f" at {explicit}" if explicit else ""
    raise FileNotFoundError(f"anvil not found{where}: run `make setup` (npm install) or set "
                            "`anvil`")


@dataclass
class RoleSpec:
    name: str
    argv: list[str]
    threads: int = 1
    health: str = ""  # GET this URL until it answers 200 before the next role starts
    rpc: bool = False  # health is a JSON-RPC endpoint (anvil)
    critical: bool = False  # the run ends when this role exits 0 (the trainer)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Layout:
    """Where a network's files and ports are."""

    cfg: NetworkConfig

    @property
    def root(self) -> Path:
        return Path(self.cfg.dir) / self.cfg.name

    def port(self, offset: int) -> int:
        return self.cfg.base_port + offset

    @property
    def public(self) -> bool:
        return bool(self.cfg.public_host)

    def host(self, offset: int) -> str:
        """The address the role at `offset` listens on and is reached at: the public host
        for the pool's public roles, loopback for the rest."""
        return self.cfg.public_host if self.public and offset not in LOCAL else "127.0.0.1"

    def url(self, offset: int) -> str:
        return f"http://{self.host(offset)}:{self.port(offset)}"

    @property
    def rpc_url(self) -> str:
        """anvil itself: on loopback, for the roles of this host."""
        return self.url(0)

    @property
    def public_rpc_url(self) -> str:
        """The chain RPC strangers use: the filter in front of anvil (public pools), else anvil."""
        return self.url(RPC_FILTER) if self.public else self.rpc_url

    @property
    def discovery_url(self) -> str:
        return self.url(1)

    @property
    def orchestrator_url(self) -> str:
        return self.url(2)

    @property
    def origin_url(self) -> str:
        return self.url(3)

    @property
    def dashboard_url(self) -> str:
        return self.url(DASHBOARD)

    def relay_urls(self) -> list[str]:
        return [self.url(4 + i) for i in range(self.cfg.relays)]

    @property
    def deployment(self) -> Path:
        return self.root / "chain" / "deployment.json"

    def config_path(self, role: str) -> Path:
        return self.root / "configs" / f"{role}.toml"

    def workers(self) -> list[tuple[str, int, bool]]:
        """(name, dev index, dishonest) of every worker."""
        w = self.cfg.workers
        out = [(f"worker-{i}", i, False) for i in range(w.honest)]
        return out + [(f"cheater-{j}", w.honest + j, True) for j in range(w.dishonest)]

    def keys(self) -> PoolKeys:
        """Every role's key (`select_keys`): dev keys for a loopback demo, the run's own
        otherwise; a pool opened to other hosts refuses well-known keys."""
        return select_keys(self.cfg, self.root, [name for name, _, _ in self.workers()])


def _meshrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshrl.cli", *args]


def _chain(lay: Layout, key: Path | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"rpc_url": lay.rpc_url, "deployment": str(lay.deployment)}
    return {**out, "key_file": str(key)} if key else out


def _rules(lay: Layout, keys: PoolKeys) -> dict[str, Any]:
    """The pool's rules; the policy signer is the trainer (it signs every version it
    publishes, workers and validators believe no other)."""
    signer = keys.trainer().address
    return {**lay.cfg.pool.rules().model_dump(mode="json"), "policy_signer": signer}


def devnet_argv(lay: Layout, keys: PoolKeys) -> list[str]:
    """`meshrl chain devnet`: contracts, gas, stake tokens, validator role, the pool."""
    cfg = lay.cfg
    n = len(lay.workers())
    providers = [keys.provider(i).address for i in range(n)]
    nodes = [keys.node(i).address for i in range(n)]
    path = write_toml(lay.config_path("devnet"), {
        "chain": _chain(lay, keys.key_file("federator")),
        "params": cfg.chain.model_dump(mode="json"),
        "manager": keys.manager().address,
        "validators": [keys.validator(j).address for j in range(cfg.validators.count)],
        "providers": providers, "fund": [*providers, *nodes, keys.trainer().address],
        "reward_rate": cfg.pool.reward_rate})
    return _meshrl("chain", "devnet", str(path))


def build_roles(lay: Layout, keys: PoolKeys, pool_id: int) -> list[RoleSpec]:
    """Every supervised role, in start order (anvil is started before the chain set-up)."""
    cfg, root = lay.cfg, lay.root
    servers = [*lay.relay_urls(), lay.origin_url]
    roles = []
    if lay.public:
        roles.append(rpc_filter_role(lay))
    roles.append(_service(lay, "discovery", 1, {
        "host": lay.host(1), "port": lay.port(1), "db": str(root / "discovery.db"),
        "sync_s": 1.0, "chain": _chain(lay)}))
    roles.append(_service(lay, "orchestrator", 2, {
        "host": lay.host(2), "port": lay.port(2), "pool_id": pool_id,
        "db": str(root / "orchestrator" / "state.db"),
        "readers": [keys.trainer().address], "chain_poll_s": cfg.poll_s,
        "chain": _chain(lay, keys.key_file("manager")),
        "guard": {"rate_per_minute": 6000, "rate_burst": 300},
        "store": {"root": str(root / "orchestrator" / "files")},
        "heartbeat": {"interval_s": cfg.pool.heartbeat_s, "dead_after": cfg.pool.dead_after},
        "onboarding": {"poll_s": 1.0, "discovery_url": lay.discovery_url},
        # a public pool sizes work orders by each member's lag; a local pool's members are
        # all near (the demo, unchanged)
        "work": {"shardcast_servers": servers, "slot_ttl_s": 120.0,
                 "turnaround_orders": lay.public},
        "join": {"rpc_url": lay.public_rpc_url, "discovery_url": lay.discovery_url,
                 "trainer": keys.trainer().address},
        "rules": _rules(lay, keys)}))
    origin = root / "shardcast" / "origin"
    # every version a file may still be judged by stays held: a file lags its step by up to
    # async_level versions and waits for its verdict up to the trainer's judge lag (2) more
    keep = str(max(5, cfg.pool.async_level + 4))
    # the trainer writes each version into the origin's store from its own process: the
    # origin finds it by re-scanning, every 50 ms (a scan of a few names; at the default
    # 0.5 s a version waited 0.24 s there, median, before any relay or worker could see it)
    roles.append(RoleSpec("origin", _meshrl("shardcast", "origin", "--root", str(origin),
                                            "--run", policy_run(pool_id),
                                            "--keep", keep, "--server.host", lay.host(3),
                                            "--server.port", str(lay.port(3)),
                                            "--server.scan_interval", "0.05"),
                          health=lay.origin_url + "/health"))
    for i, url in enumerate(lay.relay_urls()):
        roles.append(RoleSpec(f"relay-{i}", _meshrl(
            "shardcast", "relay", "--root", str(root / "shardcast" / f"relay-{i}"),
            "--keep", keep, "--upstreams", f'["{lay.origin_url}"]',
            "--server.host", lay.host(4 + i),
            "--server.port", str(lay.port(4 + i)), "--publisher", keys.trainer().address,
            "--run", policy_run(pool_id)),
            health=url + "/health"))
    roles.append(_trainer(lay, keys, origin))
    roles += [_validator(lay, keys, pool_id, servers, j) for j in range(cfg.validators.count)]
    roles += [_worker(lay, keys, name, i, bad, pool_id) for name, i, bad in lay.workers()]
    if cfg.dashboard:
        roles.append(RoleSpec("dashboard", _meshrl(
            "dashboard", "--run", str(root), "--port", str(lay.port(DASHBOARD))),
            health=lay.dashboard_url + "/health"))
    return roles


def anvil_role(lay: Layout) -> RoleSpec:
    state = lay.root / "chain" / "anvil-state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    argv = [find_anvil(lay.cfg.anvil), "--host", "127.0.0.1", "--port", str(lay.port(0)),
            "--chain-id", str(CHAIN_ID), "--silent", "--state", str(state),
            "--state-interval", "2"]
    return RoleSpec("anvil", argv, health=lay.rpc_url, rpc=True)


def rpc_filter_role(lay: Layout) -> RoleSpec:
    """The public chain RPC of a public pool: standard methods only, in front of anvil."""
    return RoleSpec("rpc-filter", _meshrl(
        "chain", "rpc-filter", "--upstream", lay.rpc_url, "--host", lay.host(RPC_FILTER),
        "--port", str(lay.port(RPC_FILTER))), health=lay.public_rpc_url + "/health")


def _service(lay: Layout, role: str, offset: int, cfg: dict[str, Any]) -> RoleSpec:
    path = write_toml(lay.config_path(role), cfg)
    return RoleSpec(role, _meshrl(role, str(path)), health=lay.url(offset) + "/health")


def _trainer(lay: Layout, keys: PoolKeys, origin: Path) -> RoleSpec:
    cfg, p = lay.cfg, lay.cfg.pool
    trainer_key = keys.key_file("trainer")
    net = {"async_level": p.async_level, "tasks": p.task,
           "run": {"dir": str(lay.root), "name": "trainer", "threads": cfg.threads.trainer,
                   "progress": False},
           "rollout": {"group_size": p.group_size, "temperature": p.temperature,
                       "max_new_tokens": p.max_new_tokens, "prompt_format": p.prompt_format},
           "network": {"orchestrator_url": lay.orchestrator_url, "key_file": str(trainer_key),
                       "origin_root": str(origin), "poll_s": cfg.poll_s}}
    path = write_toml(lay.config_path("trainer"), _merge(net, cfg.train))
    return RoleSpec("trainer", _meshrl("train", cfg.train_config, str(path)),
                    threads=cfg.threads.trainer, critical=True)


def validator_name(j: int) -> str:
    """`validator` (the first, as when there was one), then `validator-1`, ..."""
    return "validator" if j == 0 else f"validator-{j}"


def validator_names(cfg: NetworkConfig) -> list[str]:
    return [validator_name(j) for j in range(cfg.validators.count)]


def _validator(lay: Layout, keys: PoolKeys, pool_id: int, servers: list[str],
               j: int) -> RoleSpec:
    """Validator j of n: judges its share of the files (work id mod n == j) and re-judges
    every file another validator accused; the last `validators.rogue` ones are rogue."""
    cfg, name = lay.cfg, validator_name(j)
    v = cfg.validators
    rogue = j >= v.count - v.rogue
    path = write_toml(lay.config_path(name), {
        "pool_id": pool_id, "orchestrator_url": lay.orchestrator_url,
        "work_dir": str(lay.root / name), "poll_interval": cfg.poll_s,
        "keys": keys.validator_keys(j), "chain": _chain(lay),
        "shardcast_servers": servers, "rules": _rules(lay, keys),
        "engine": {"num_threads": cfg.threads.validator},
        "share": {"index": j, "of": v.count, "audit": v.audit if v.count > 1 else 0.0},
        "bond_verdicts": v.bond_verdicts,
        "rogue": {"mode": "accuse-honest" if rogue else "none",
                  "accusations": v.rogue_accusations},
        "retry": {"backoff": 1.0, "max_attempts": 6}})
    command = ("adversary", "validator") if rogue else ("validator",)  # meshrl.adversaries
    return RoleSpec(name, _meshrl(*command, str(path)), threads=cfg.threads.validator)


def _worker(lay: Layout, keys: PoolKeys, name: str, index: int, dishonest: bool,
            pool_id: int) -> RoleSpec:
    cfg = lay.cfg
    cheat = cfg.workers.cheat.model_dump() if dishonest else {"mode": "none"}
    forge = cfg.workers.forge_tasks
    if dishonest and index - cfg.workers.honest < len(forge):  # cheaters follow the honest
        cheat["forge_task"] = forge[index - cfg.workers.honest]
    per_worker = cfg.workers.compute  # index: the worker's place, honest ones first
    compute = per_worker[index].model_dump() if index < len(per_worker) else {}
    path = write_toml(lay.config_path(name), {**compute,
        "pool_id": pool_id, "orchestrator_url": lay.orchestrator_url,
        "discovery_url": lay.discovery_url, "work_dir": str(lay.root / "workers" / name),
        "poll_interval": cfg.workers.poll_interval,
        "heartbeat_interval": cfg.workers.heartbeat_interval,
        "claim_every_s": cfg.workers.claim_every_s,
        "keys": keys.worker_keys(index), "chain": _chain(lay), "rules": _rules(lay, keys),
        "engine": {"num_threads": cfg.threads.worker}, "cheat": cheat})
    command = ("adversary", "worker") if dishonest else ("worker",)  # meshrl.adversaries
    return RoleSpec(name, _meshrl(*command, str(path)), threads=cfg.threads.worker)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
