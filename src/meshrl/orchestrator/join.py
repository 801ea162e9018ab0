"""`GET /join`: the pool's join manifest, its chain part read from the chain (code hashes,
stake terms, reward rate) and kept `join.cache_s` seconds, the rest from the config; signed by
the pool manager's key (the orchestrator's).

The route is unsigned and open to anyone, so what it costs is bounded here: one read of the
chain at a time (single flight: every request that finds the facts stale waits for the same
read), none while they are fresh, and after a failed read none for `retry_s`, so a crowd at
cache expiry or during an RPC outage costs a handful of chain calls, not one read each. A read
that fails answers `503 chain_unavailable` with one line, never a traceback.

The manifest never names the orchestrator's own RPC (`chain.rpc_url`: often a provider's URL
with an API key, or on a dev chain anvil itself): only `join.rpc_url`, the public one the
operator configured, without credentials, query or fragment; else nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from eth_utils import keccak

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.pool import JoinManifest, PoolRules
from meshrl.protocol.chain import Protocol
from meshrl.protocol.signing import sign_digest

__all__ = ["ChainFacts", "JoinDesk", "JoinUnavailable", "public_rpc_url", "read_chain_facts"]

log = get_logger("meshrl.orchestrator.join")


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


class JoinUnavailable(RuntimeError):
    """The chain's part of the manifest could not be read (its RPC is down): one line."""


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


def public_rpc_url(url: str) -> str:
    """`url` as it may be published: no user, password, query or fragment (where API keys
    travel); "" for anything that is not an http(s) URL."""
    try:
        u = urlsplit(url.strip())
        host = u.hostname or ""
        port = u.port
    except ValueError:
        return ""
    if u.scheme not in ("http", "https") or not host:
        return ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return urlunsplit((u.scheme, netloc, u.path, "", ""))


class JoinDesk:
    """Builds the manifest; the chain's part is read again after `cfg.join.cache_s`, by one
    read at a time. `key` (the manager's) signs each new manifest once."""

    def __init__(self, cfg: OrchestratorConfig, rules: PoolRules, readers: list[str],
                 key: bytes | str | None = None, signer: str = "",
                 retry_s: float = 1.0) -> None:
        self.cfg, self.rules, self.key, self.signer = cfg, rules, key, signer
        self.trainer = cfg.join.trainer or (readers[0] if readers else "")
        self.retry_s = retry_s
        self._facts: ChainFacts | None = None
        self._read_at = 0.0
        self._signed: tuple[ChainFacts, int, JoinManifest] | None = None
        self._flight: asyncio.Future[ChainFacts] | None = None
        self._failed: tuple[float, str] | None = None  # (monotonic time, reason)
        self.reads = 0  # chain reads started (each a handful of calls)

    def stale(self) -> bool:
        return self._facts is None or time.monotonic() - self._read_at > self.cfg.join.cache_s

    def update(self, facts: ChainFacts) -> None:
        self._facts, self._read_at = facts, time.monotonic()

    async def facts(self, read: Callable[[], Awaitable[ChainFacts]]) -> ChainFacts:
        """Fresh facts: the cached ones, else the result of the one read in flight (started
        here when none is). Raises `JoinUnavailable` when the read fails, and for `retry_s`
        after a failure without reading again."""
        if not self.stale():
            assert self._facts is not None
            return self._facts
        if self._flight is None:
            if self._failed is not None and time.monotonic() - self._failed[0] < self.retry_s:
                raise JoinUnavailable(self._failed[1])
            self.reads += 1
            self._flight = asyncio.ensure_future(self._read(read))
            # retrieved here too, so a read nobody waits for any more raises no warning
            self._flight.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(self._flight)

    async def _read(self, read: Callable[[], Awaitable[ChainFacts]]) -> ChainFacts:
        try:
            facts = await read()
        except Exception as e:  # any transport or node failure: one line, no traceback
            why = f"the chain's RPC did not answer: {type(e).__name__}: {str(e)[:200]}"
            if self._failed is None:
                log_event(log, "join manifest unavailable", error=why)
            self._failed = (time.monotonic(), why)
            raise JoinUnavailable(why) from None
        finally:
            self._flight = None
        if self._failed is not None:
            log_event(log, "join manifest available again")
        self._failed = None
        self.update(facts)
        return facts

    async def answer(self, read: Callable[[], Awaitable[ChainFacts]],
                     max_units: int) -> JoinManifest:
        """The manifest for one request: fresh facts, signed once, this clock's time."""
        facts = await self.facts(read)
        signed = self._signed
        if signed is None or signed[0] is not facts or signed[1] != max_units:
            signed = (facts, max_units, self.manifest(max_units, facts))
            self._signed = signed
        return signed[2].model_copy(update={"server_time": time.time()})

    def manifest(self, max_units: int, facts: ChainFacts | None = None) -> JoinManifest:
        c, j = self.cfg, self.cfg.join
        f = facts or self._facts
        assert f is not None
        m = JoinManifest(
            pool_id=c.pool_id, domain_id=f.domain, chain_id=f.chain_id,
            rpc_url=public_rpc_url(j.rpc_url), token=f.token, protocol=f.protocol,
            deployment_block=f.block, code_hashes=f.code_hashes, rules=self.rules,
            rules_digest=self.rules.digest(),
            discovery_url=j.discovery_url or c.onboarding.discovery_url,
            shardcast_servers=c.work.shardcast_servers, min_stake=f.min_stake,
            stake_per_unit=f.stake_per_unit, reward_rate=f.reward_rate,
            max_units_per_file=min(max_units, f.max_units), trainer=self.trainer,
            heartbeat_interval_s=c.heartbeat.interval_s, dead_after=c.heartbeat.dead_after,
            signature_window_s=c.guard.max_skew_s, server_time=time.time(),
            signer=self.signer if self.key is not None else "")
        if self.key is None:
            return m
        sig = sign_digest(self.key, m.digest())
        return m.model_copy(update={"signature": "0x" + sig.hex()})
