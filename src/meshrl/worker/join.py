"""`meshrl worker join URL`: a stranger's way into a pool, with nothing but the orchestrator's URL.

In order, each step refusing with one line when it cannot succeed: the machine meets the
worker's requirements; `GET /join` gives the manifest; this clock is within the pool's
signature window of the orchestrator's (every signed request would be refused otherwise); the
manifest's RPC is the chain it names and its contracts have the code it names and are
meshrl's own (`meshrl.protocol.verify`); the keystores open. Then it prints what to fund (the
provider's stake tokens and gas, the node's gas for `join_pool`) and waits until the chain
shows it, writes the deployment it learnt to the work directory and runs the worker
(`WorkerNode`: stake, add the node, announce, join, work).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from pydantic import ValidationError

from meshrl.log import get_logger, log_event
from meshrl.pool import JoinManifest
from meshrl.protocol import Deployment, Protocol
from meshrl.protocol.backend import Backend
from meshrl.protocol.verify import check_contracts
from meshrl.worker.config import JoinConfig, WorkerConfig
from meshrl.worker.keys import WorkerKeys

__all__ = [
    "ClockSkew",
    "Funding",
    "JoinConfig",
    "JoinError",
    "check_clock",
    "fetch_manifest",
    "funding_needed",
    "joined_config",
    "wait_funded",
]

log = get_logger("meshrl.worker")


class JoinError(RuntimeError):
    """A step of joining that cannot succeed (unreachable pool, bad manifest, ...)."""


class ClockSkew(JoinError):
    """This machine's clock is further from the orchestrator's than the signature window."""

    def __init__(self, offset_s: float, window_s: int) -> None:
        super().__init__(f"this clock is {offset_s:+.0f} s off the orchestrator's (the pool "
                         f"refuses signed requests more than {window_s} s off): set the time "
                         "(e.g. enable NTP) and start again")
        self.offset_s, self.window_s = offset_s, window_s


async def fetch_manifest(url: str, timeout_s: float = 10.0) -> tuple[JoinManifest, float]:
    """The pool's manifest and this clock's offset from the orchestrator's (seconds, + when
    the orchestrator is ahead), measured at the middle of the round trip."""
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            t0 = time.time()
            async with s.get(url.rstrip("/") + "/join") as r:
                body = await r.read()
                t1 = time.time()
                if r.status != 200:
                    raise JoinError(f"{url}/join answered {r.status}: {body[:200]!r}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise JoinError(f"{url} unreachable: {e or type(e).__name__}") from None
    try:
        m = JoinManifest.model_validate(json.loads(body))
    except (ValueError, ValidationError) as e:
        raise JoinError(f"{url}/join is not a join manifest: {str(e)[:300]}") from None
    return m, m.server_time - (t0 + t1) / 2


def check_clock(offset_s: float, window_s: int, margin_s: float = 30.0) -> None:
    """Refuse (`ClockSkew`) a clock whose signed requests the pool would refuse."""
    if abs(offset_s) > max(1.0, window_s - margin_s):
        raise ClockSkew(offset_s, window_s)


def deployment_of(m: JoinManifest) -> Deployment:
    return Deployment(chain_id=m.chain_id, token=m.token, protocol=m.protocol,
                      federator="0x" + "00" * 20, block=m.deployment_block)


def verify_chain(backend: Backend, m: JoinManifest) -> None:
    """The manifest's chain and contracts, as its RPC serves them (`ContractMismatch`)."""
    check_contracts(backend, m.chain_id, {"token": m.token, "protocol": m.protocol},
                    m.code_hashes)


@dataclass(frozen=True)
class Funding:
    """What the chain must show before onboarding can start (wei and token base units)."""

    provider: str
    node: str
    provider_wei: int
    node_wei: int
    tokens: int

    def lacking(self, chain: Protocol) -> dict[str, int]:
        """What is still missing (empty: funded)."""
        eth = chain.backend.w3.eth
        out = {}
        if (have := eth.get_balance(self.provider)) < self.provider_wei:  # type: ignore[arg-type]
            out["provider_wei"] = self.provider_wei - have
        if (have := eth.get_balance(self.node)) < self.node_wei:  # type: ignore[arg-type]
            out["node_wei"] = self.node_wei - have
        if self.tokens and (have := chain.balance(self.provider)) < self.tokens:
            out["tokens"] = self.tokens - have
        return out

    def line(self, m: JoinManifest, lacking: dict[str, int]) -> str:
        parts, mine = [], []
        if "provider_wei" in lacking:
            mine.append(f"{_eth(self.provider_wei)} ETH")
        if "tokens" in lacking:
            mine.append(f"{_eth(self.tokens)} tokens (token {m.token})")
        if mine:
            parts.append(f"provider {self.provider}: " + " and ".join(mine))
        if "node_wei" in lacking:
            parts.append(f"node {self.node}: {_eth(self.node_wei)} ETH")
        return (f"fund on chain {m.chain_id} ({m.rpc_url}), then this worker goes on by "
                "itself: " + "; ".join(parts))


def _eth(wei: int) -> str:
    return f"{wei / 10**18:.6f}".rstrip("0").rstrip(".") or "0"


def funding_needed(chain: Protocol, keys: WorkerKeys, cfg: JoinConfig,
                   m: JoinManifest) -> Funding:
    """Gas for both keys at twice today's gas price, and the stake tokens onboarding will
    lock (none when the node is already added to this provider)."""
    price = 2 * int(chain.backend.w3.eth.gas_price)
    me = chain.as_(keys.provider)
    units = cfg.onboard.compute_units
    need = max(m.min_stake, units * m.stake_per_unit)
    info, node = me.provider(), me.node(keys.node.address)
    if node.compute_units and node.provider.lower() == me.address.lower():
        tokens = 0
    elif not info.registered:
        tokens = max(cfg.onboard.stake, need)
    else:
        tokens = max(0, max(need, me.required_stake() + units * m.stake_per_unit) - info.stake)
    return Funding(keys.provider.address, keys.node.address, cfg.provider_gas * price,
                   cfg.node_gas * price, tokens)


async def wait_funded(chain: Protocol, funding: Funding, m: JoinManifest, cfg: JoinConfig,
                      stop: asyncio.Event, out: TextIO = sys.stderr) -> bool:
    """Print what to fund once (and again when it changes), return when the chain shows it
    (True) or when stopped or timed out (False)."""
    deadline = time.monotonic() + cfg.fund_timeout_s if cfg.fund_timeout_s else None
    said: dict[str, int] | None = None
    while not stop.is_set():
        try:
            lacking = await asyncio.to_thread(funding.lacking, chain)
        except Exception as e:  # a transport error while waiting is worth a line, not an exit
            log_event(log, "funding check failed", error=str(e))
            lacking = said or {"unknown": 1}
        if not lacking:
            log_event(log, "funded", provider=funding.provider, node=funding.node)
            return True
        if said is None or set(lacking) != set(said):
            print(funding.line(m, lacking), file=out, flush=True)
            log_event(log, "waiting for funds", **lacking)
        said = lacking
        if deadline is not None and time.monotonic() > deadline:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), cfg.fund_poll_s)
    return False


def joined_config(cfg: JoinConfig, m: JoinManifest, deployment: Path) -> WorkerConfig:
    """The worker's config: the join options, with the pool, discovery and chain the
    manifest names."""
    data: dict[str, Any] = cfg.model_dump(exclude={"url", "fund_poll_s", "fund_timeout_s",
                                                   "provider_gas", "node_gas",
                                                   "clock_margin_s"})
    data.update(pool_id=m.pool_id, orchestrator_url=cfg.url.rstrip("/"),
                discovery_url=m.discovery_url)
    data["chain"] = {**data["chain"], "backend": "rpc", "rpc_url": m.rpc_url,
                     "deployment": str(deployment), "chain_id": m.chain_id}
    return WorkerConfig.model_validate(data)
