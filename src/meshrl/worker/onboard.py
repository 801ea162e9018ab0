"""Joining a pool, each step skipped when already done (so a restart repeats nothing):
register as a provider with stake, add the node (the node key signs the ownership proof),
announce the node to discovery, fetch the orchestrator's invite and join the pool on chain."""

from __future__ import annotations

import asyncio
import time

from meshrl.log import get_logger, log_event
from meshrl.protocol import Protocol, TxReverted
from meshrl.wire import NoInvite, SignedClient, WireHTTPError
from meshrl.wire.models import Accelerator, Hardware, Invite, NodeAnnouncement
from meshrl.worker.config import WorkerConfig
from meshrl.worker.hardware import HardwareInfo
from meshrl.worker.keys import WorkerKeys

__all__ = ["OnboardError", "announce_and_join", "onboard_chain"]

log = get_logger("meshrl.worker")


class OnboardError(RuntimeError):
    """A step of onboarding that cannot succeed as configured (no funds, another provider...)."""


class Blacklisted(OnboardError):
    """The pool blacklisted this node (its work was hard-invalidated): it can never rejoin."""


def onboard_chain(chain: Protocol, keys: WorkerKeys, cfg: WorkerConfig) -> list[str]:
    """Register + stake and add the node on chain where needed; the steps taken."""
    me = chain.as_(keys.provider)
    done = []
    units = cfg.onboard.compute_units
    info = me.provider()
    f = me.contract.functions
    per_unit = me.backend.call(f.stake_per_unit(), me.address)
    need = max(me.backend.call(f.min_stake(), me.address), units * per_unit)
    if not info.registered:
        amount = max(cfg.onboard.stake, need)
        if me.balance() < amount:
            raise OnboardError(f"provider {me.address} holds {me.balance()} tokens, staking "
                               f"needs {amount}")
        me.register_provider(amount)
        done.append(f"registered with stake {amount}")
    node = me.node(keys.node.address)
    if node.compute_units == 0:
        stake = me.provider().stake
        required = max(need, me.required_stake() + units * per_unit)
        if stake < required:
            me.add_stake(required - stake)
            done.append(f"added stake {required - stake}")
        me.add_node(keys.node, units)
        done.append(f"added node {keys.node.address}")
    elif node.provider.lower() != me.address.lower():
        raise OnboardError(f"node {keys.node.address} belongs to provider {node.provider}")
    return done


def announcement(cfg: WorkerConfig, keys: WorkerKeys, hw: HardwareInfo) -> NodeAnnouncement:
    accel = [Accelerator(name=a, memory_gb=0.0) for a in hw.accelerators]
    compute = hw.compute or {}
    if str(compute.get("device", "cpu")).startswith("cuda"):  # the GPU it computes on, sized
        accel = [Accelerator(name=str(compute["name"]), memory_gb=float(compute["memory_gb"]))]
    software = {"python": hw.python, "torch": hw.torch or "none"}
    return NodeAnnouncement(provider=keys.provider.address, pool_id=cfg.pool_id,
                            hardware=Hardware(cores=hw.cpu_cores, memory_gb=hw.memory_gb,
                                              accelerators=accel), software=software)


async def announce_and_join(chain: Protocol, keys: WorkerKeys, cfg: WorkerConfig,
                            hw: HardwareInfo, orch: SignedClient, stop: asyncio.Event,
                            timeout: float = 600.0) -> str:
    """Announce to discovery and join the pool with the invite, unless already a member."""
    node = await asyncio.to_thread(chain.node, keys.node.address)
    if node.pool == cfg.pool_id:
        return "already in the pool"
    if node.pool != 0:
        raise OnboardError(f"node is in pool {node.pool}, not {cfg.pool_id}")
    if await asyncio.to_thread(chain.is_blacklisted, cfg.pool_id, keys.node.address):
        raise Blacklisted(f"node {keys.node.address} is blacklisted in pool {cfg.pool_id} "
                          "(its work was hard-invalidated) and cannot rejoin it")
    async with SignedClient(cfg.discovery_url, keys.node.key,
                            timeout_s=cfg.http_timeout_s) as disc:
        await disc.call("PUT", "/nodes", announcement(cfg, keys, hw))
    log_event(log, "announced; waiting for an invite", pool=cfg.pool_id)
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        try:
            inv = await orch.call("GET", "/invite", response=Invite)
        except WireHTTPError as e:
            if not isinstance(e, NoInvite) or time.monotonic() > deadline:
                raise
            # a node ejected for fraud is blacklisted a moment after its ejection: it may have
            # started to wait for an invite just before, and must not wait for one for good
            if await asyncio.to_thread(chain.is_blacklisted, cfg.pool_id, keys.node.address):
                raise Blacklisted(f"node {keys.node.address} is blacklisted in pool "
                                  f"{cfg.pool_id} (its work was hard-invalidated) and cannot "
                                  "rejoin it") from None
            await asyncio.sleep(cfg.poll_interval)
            continue
        me = chain.as_(keys.node)
        try:
            await asyncio.to_thread(me.join_pool, inv.pool_id, keys.node.address, inv.nonce,
                                    inv.expiry, bytes.fromhex(inv.signature.removeprefix("0x")))
        except TxReverted as e:
            raise OnboardError(f"join_pool refused: {e}") from None
        return f"joined pool {inv.pool_id}"
    return "stopped"
