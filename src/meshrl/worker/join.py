"""`meshrl worker join URL`: a stranger's way into a pool, with nothing but the orchestrator's URL
and an RPC of the pool's chain it trusts.

In order, each step refusing with one line when it cannot succeed: the machine meets the
worker's requirements; `GET /join` gives the manifest; this clock is within the pool's
signature window of the orchestrator's (every signed request would be refused otherwise). Then
nothing the pool served is taken on its word (`confirm_pool`): through the contributor's OWN
RPC (`--chain.rpc_url`; the manifest's `rpc_url` is only a hint and is never read) the chain is
the one the manifest names, the code at both addresses hashes as named and is meshrl's own
(`meshrl.protocol.verify`), the token's own record makes the protocol its minter and the
protocol's its token (so the spender every approval names is the token's protocol, not an
address a hostile pool picked), the deployment matches what the contributor pinned
(`pin_deployment`, `pin_protocol`), and the manifest is signed by the pool's manager on chain.
Then the keystores open; it prints what to fund (the provider's stake tokens and gas, the
node's gas for `join_pool`) and waits until the chain shows it, writes the confirmed deployment
to the work directory and runs the worker on its own RPC (`WorkerNode`: stake, add the node,
announce, join, work).
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
from eth_utils import is_address, to_checksum_address
from pydantic import ValidationError

from meshrl.log import get_logger, log_event
from meshrl.pool import JoinManifest
from meshrl.protocol import Deployment, Protocol
from meshrl.protocol.backend import Backend
from meshrl.protocol.signing import recover_digest
from meshrl.protocol.verify import ContractMismatch, check_contracts
from meshrl.worker.config import JoinConfig, WorkerConfig
from meshrl.worker.keys import WorkerKeys

__all__ = [
    "ClockSkew",
    "Funding",
    "JoinConfig",
    "JoinError",
    "PoolNotConfirmed",
    "check_clock",
    "confirm_pool",
    "fetch_manifest",
    "funding_needed",
    "joined_config",
    "wait_funded",
]

log = get_logger("meshrl.worker")


class JoinError(RuntimeError):
    """A step of joining that cannot succeed (unreachable pool, bad manifest, ...)."""


class PoolNotConfirmed(JoinError):
    """The pool's manifest is not what the contributor's own RPC (or pins) show: nothing is
    signed for it. `what` names the fact that failed (chain_id, token, protocol, minter,
    pin, signature, pool)."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"refused: the pool's manifest is not confirmed by your own RPC "
                         f"({what}): {detail}; nothing was signed")
        self.what = what


class ClockSkew(JoinError):
    """This machine's clock is further from the orchestrator's than the signature window."""

    def __init__(self, offset_s: float, window_s: int) -> None:
        super().__init__(f"this clock is {offset_s:+.0f} s off the orchestrator's (the pool "
                         f"refuses signed requests more than {window_s} s off): set the time "
                         "(e.g. enable NTP) and start again")
        self.offset_s, self.window_s = offset_s, window_s


MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few KiB: anything larger is refused unread


async def _read_bounded(r: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The whole body, however many pieces it comes in; `JoinError` past `limit` bytes."""
    if r.content_length is not None and r.content_length > limit:
        raise JoinError(f"{what} answered {r.content_length} bytes, more than {limit}")
    parts, size = [], 0
    while chunk := await r.content.read(limit + 1 - size):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            raise JoinError(f"{what} answered more than {limit} bytes")
    return b"".join(parts)


async def fetch_manifest(url: str, timeout_s: float = 10.0) -> tuple[JoinManifest, float]:
    """The pool's manifest and this clock's offset from the orchestrator's (seconds, + when
    the orchestrator is ahead), measured at the middle of the round trip."""
    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            t0 = time.time()
            async with s.get(url.rstrip("/") + "/join") as r:
                body = await _read_bounded(r, MAX_MANIFEST_BYTES, f"{url}/join")
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


ZERO = "0x" + "00" * 20


def load_pin(path: str) -> Deployment | None:
    """The deployment the contributor pinned (`pin_deployment`), None when none."""
    if not path:
        return None
    try:
        return Deployment.load(Path(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise JoinError(f"pin_deployment {path}: {e}") from None


def confirm_pool(backend: Backend, m: JoinManifest, pin: Deployment | None = None,
                 pin_protocol: str = "") -> JoinManifest:
    """Confirm the manifest through `backend`, the contributor's OWN RPC (blocking), or raise
    `PoolNotConfirmed`. Returns the manifest with the stake and reward terms as that chain
    states them. What is confirmed, in order:

    - the pins: `pin` (a deployment the contributor trusts) names the same chain id, token and
      protocol; `pin_protocol` is the protocol;
    - the chain id, and the code at both addresses: hashed as named and meshrl's own;
    - the link between them, from the token's own state: the protocol is one of the token's
      minters (only the token's owner appoints one) and the protocol's token is this token, so
      an approval on this token can only name this token's protocol as spender;
    - the pool exists, its manager signed the manifest.
    """
    for what in ("token", "protocol"):
        if not is_address(getattr(m, what)):
            raise PoolNotConfirmed(what, f"{getattr(m, what)!r} is not an address")
    if not is_address(m.signer):
        raise PoolNotConfirmed("signature", f"the manifest is not signed (signer {m.signer!r})")
    m = m.model_copy(update={w: to_checksum_address(getattr(m, w))
                             for w in ("token", "protocol", "signer")})
    addrs = {"token": m.token, "protocol": m.protocol}
    if pin is not None:
        for what, mine, theirs in (("chain_id", pin.chain_id, m.chain_id),
                                   ("token", pin.token, m.token),
                                   ("protocol", pin.protocol, m.protocol)):
            if str(mine).lower() != str(theirs).lower():
                raise PoolNotConfirmed("pin", f"your pinned deployment names {what} {mine}, "
                                       f"the pool {theirs}")
    if pin_protocol and pin_protocol.lower() != m.protocol.lower():
        raise PoolNotConfirmed("pin", f"you pinned protocol {pin_protocol}, the pool names "
                               f"{m.protocol}")
    try:
        check_contracts(backend, m.chain_id, addrs, m.code_hashes)
    except ContractMismatch as e:
        raise PoolNotConfirmed(e.what, str(e)) from None
    except Exception as e:  # the RPC's transport or answer failed: nothing is confirmed
        raise PoolNotConfirmed("read", f"{type(e).__name__}: {str(e)[:200]}") from None
    chain = Protocol(backend, deployment_of(m))
    try:
        minter = bool(backend.call(chain.token.functions.minters(m.protocol)))
        token_of = str(backend.call(chain.contract.functions.token()))
        manager = str(chain.pool_manager(m.pool_id))
        pool = chain.pool(m.pool_id)
        f = chain.contract.functions
        min_stake = int(backend.call(f.min_stake()))
        per_unit = int(backend.call(f.stake_per_unit()))
    except Exception as e:  # a revert or transport failure of a read: not confirmed
        raise PoolNotConfirmed("read", f"{type(e).__name__}: {str(e)[:200]}") from None
    if not minter:
        raise PoolNotConfirmed("minter", f"the token {m.token} does not make {m.protocol} "
                               "its minter: that protocol is not the token's (an approval "
                               "would hand tokens to a stranger)")
    if token_of.lower() != m.token.lower():
        raise PoolNotConfirmed("token", f"the protocol {m.protocol} stakes token {token_of}, "
                               f"not {m.token}")
    if manager.lower() == ZERO:
        raise PoolNotConfirmed("pool", f"pool {m.pool_id} has no manager on chain")
    try:
        signer = recover_digest(m.digest(), bytes.fromhex(m.signature.removeprefix("0x")))
    except ValueError as e:
        raise PoolNotConfirmed("signature", f"the manifest is not signed ({e})") from None
    if signer.lower() != manager.lower() or m.signer.lower() != manager.lower():
        raise PoolNotConfirmed("signature", f"the manifest is signed by {signer}, pool "
                               f"{m.pool_id}'s manager on chain is {manager}")
    return m.model_copy(update={"domain_id": int(pool.domain), "min_stake": min_stake,
                                "stake_per_unit": per_unit,
                                "reward_rate": int(pool.reward_rate)})


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

    def line(self, m: JoinManifest, lacking: dict[str, int], rpc: str) -> str:
        parts, mine = [], []
        if "provider_wei" in lacking:
            mine.append(f"{_eth(self.provider_wei)} ETH")
        if "tokens" in lacking:
            mine.append(f"{_eth(self.tokens)} tokens (token {m.token})")
        if mine:
            parts.append(f"provider {self.provider}: " + " and ".join(mine))
        if "node_wei" in lacking:
            parts.append(f"node {self.node}: {_eth(self.node_wei)} ETH")
        return (f"fund on chain {m.chain_id} ({rpc}), then this worker goes on by "
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
            print(funding.line(m, lacking, cfg.chain.rpc_url), file=out, flush=True)
            log_event(log, "waiting for funds", **lacking)
        said = lacking
        if deadline is not None and time.monotonic() > deadline:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), cfg.fund_poll_s)
    return False


def joined_config(cfg: JoinConfig, m: JoinManifest, deployment: Path) -> WorkerConfig:
    """The worker's config: the join options, with the pool and discovery the manifest names
    and its confirmed deployment, read through the contributor's own RPC."""
    data: dict[str, Any] = cfg.model_dump(exclude={"url", "fund_poll_s", "fund_timeout_s",
                                                   "provider_gas", "node_gas",
                                                   "clock_margin_s", "pin_deployment",
                                                   "pin_protocol"})
    data.update(pool_id=m.pool_id, orchestrator_url=cfg.url.rstrip("/"),
                discovery_url=m.discovery_url)
    data["chain"] = {**data["chain"], "backend": "rpc", "rpc_url": cfg.chain.rpc_url,
                     "deployment": str(deployment), "chain_id": m.chain_id}
    return WorkerConfig.model_validate(data)
