"""`GET /join`: the pool's join manifest, its chain part read from the chain (code hashes,
stake terms, reward rate) and kept `join.cache_s` seconds, the rest from the config."""

from __future__ import annotations

import time
from dataclasses import dataclass

from eth_utils import keccak

from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.pool import JoinManifest, PoolRules
from meshrl.protocol.chain import Protocol

__all__ = ["ChainFacts", "JoinDesk", "read_chain_facts"]


@dataclass(frozen=True)
class ChainFacts:
    chain_id: int
    token: str
    protocol: str
    block: int
    code_hashes: dict[str, str]
    domain: int
    min_stake: int
    stake_per_unit: int
    reward_rate: int
    max_units: int


def read_chain_facts(p: Protocol, pool_id: int) -> ChainFacts:
    """What the chain says of the pool a stranger would join (blocking: call in a thread)."""
    eth, f = p.backend.w3.eth, p.contract.functions
    dep = p.deployment
    hashes = {name: "0x" + keccak(bytes(eth.get_code(addr))).hex()
              for name, addr in (("token", dep.token), ("protocol", dep.protocol))}
    pool = p.pool(pool_id)
    return ChainFacts(p.backend.chain_id, dep.token, dep.protocol, dep.block, hashes,
                      pool.domain, int(p.backend.call(f.min_stake())),
                      int(p.backend.call(f.stake_per_unit())), int(pool.reward_rate),
                      int(pool.max_units))


class JoinDesk:
    """Builds the manifest; the chain's part is read again after `cfg.join.cache_s`."""

    def __init__(self, cfg: OrchestratorConfig, rules: PoolRules, readers: list[str]) -> None:
        self.cfg, self.rules = cfg, rules
        self.trainer = cfg.join.trainer or (readers[0] if readers else "")
        self._facts: ChainFacts | None = None
        self._read_at = 0.0

    def stale(self) -> bool:
        return self._facts is None or time.monotonic() - self._read_at > self.cfg.join.cache_s

    def update(self, facts: ChainFacts) -> None:
        self._facts, self._read_at = facts, time.monotonic()

    def manifest(self, max_units: int) -> JoinManifest:
        c, j = self.cfg, self.cfg.join
        f = self._facts
        assert f is not None
        return JoinManifest(
            pool_id=c.pool_id, domain_id=f.domain, chain_id=f.chain_id,
            rpc_url=j.rpc_url or c.chain.rpc_url, token=f.token, protocol=f.protocol,
            deployment_block=f.block, code_hashes=f.code_hashes, rules=self.rules,
            rules_digest=self.rules.digest(),
            discovery_url=j.discovery_url or c.onboarding.discovery_url,
            shardcast_servers=c.work.shardcast_servers, min_stake=f.min_stake,
            stake_per_unit=f.stake_per_unit, reward_rate=f.reward_rate,
            max_units_per_file=min(max_units, f.max_units), trainer=self.trainer,
            heartbeat_interval_s=c.heartbeat.interval_s, dead_after=c.heartbeat.dead_after,
            signature_window_s=c.guard.max_skew_s, server_time=time.time())
