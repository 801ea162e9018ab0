"""Onboarding: read the pool's candidates from discovery, check each on chain and against the
pool's hardware requirements, and sign a one-time, expiring invite the node fetches itself
(`GET /invite`), so nodes behind NAT need no inbound connection. The node then joins on chain;
the `NodeJoined` event makes it a member (see `chainview`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.config import Requirements
from meshrl.wire.client import SignedClient
from meshrl.wire.errors import WireHTTPError
from meshrl.wire.models import Hardware, NodeEntry, NodeList, NodeState, NodeStatus

if TYPE_CHECKING:
    from meshrl.orchestrator.service import Orchestrator

__all__ = ["Onboarding", "hardware_shortfall"]

log = get_logger("meshrl.orchestrator.onboarding")


def hardware_shortfall(hw: Hardware, req: Requirements) -> str:
    """Why `hw` does not meet `req` ("" if it does)."""
    if hw.cores < req.min_cores:
        return f"{hw.cores} cores < {req.min_cores}"
    if hw.memory_gb < req.min_memory_gb:
        return f"{hw.memory_gb} GB memory < {req.min_memory_gb}"
    fit = [a for a in hw.accelerators if a.memory_gb >= req.min_accelerator_memory_gb]
    if sum(a.count for a in fit) < req.min_accelerators:
        return f"fewer than {req.min_accelerators} accelerators with " \
               f"{req.min_accelerator_memory_gb} GB"
    return ""


class Onboarding:
    def __init__(self, orch: Orchestrator) -> None:
        self.o = orch
        self.cfg = orch.cfg.onboarding
        # candidate -> (last reason, when to look again): chain checks are not repeated for
        # every poll of a candidate that cannot join
        self.refused: dict[str, tuple[str, float]] = {}
        self._client: SignedClient | None = None

    async def run(self) -> float:
        """One pass over discovery's candidates; returns the delay before the next."""
        if not self.cfg.discovery_url:
            return 3600.0
        if self._client is None:
            self._client = SignedClient(self.cfg.discovery_url, self.o.protocol.account.key)
        try:
            listing = await self._client.call(
                "GET", f"/pools/{self.o.cfg.pool_id}/nodes", response=NodeList)
        except (WireHTTPError, OSError) as e:
            log_event(log, "discovery unavailable", error=str(e))
            return self.cfg.poll_s
        for entry in listing.nodes:
            await self.consider(entry)
        return self.cfg.poll_s

    async def consider(self, entry: NodeEntry) -> str:
        """Invite `entry` if it qualifies; returns why not ("" when invited or already)."""
        node = entry.address
        row = self.o.state.node(node)
        if row is not None and row.state is not NodeState.EJECTED:
            return ""
        pending = self.o.state.invite(node)
        if pending is not None and pending[2] > time.time() + 30:
            return ""
        last = self.refused.get(node)
        if last is not None and last[1] > time.monotonic():
            return last[0]
        why = self._precheck(entry)
        if not why:
            ok = await self.o.chain.run(self.o.chain.eligibility, node, entry.info.provider)
            why = ok.reason
        if why:
            if last is None or last[0] != why:
                log_event(log, "candidate refused", node=node, reason=why)
            self.refused[node] = (why, time.monotonic() + self.cfg.recheck_s)
            return why
        nonce, expiry, sig, _ = await self.o.chain.run(
            self.o.chain.make_invite, node, self.cfg.invite_ttl_s)
        self.o.state.put_invite(node, entry.info.provider, nonce, expiry, sig)
        self.refused.pop(node, None)
        log_event(log, "invite signed", node=node, expiry=expiry)
        return ""

    def _precheck(self, entry: NodeEntry) -> str:
        if entry.info.pool_id != self.o.cfg.pool_id:
            return f"wants pool {entry.info.pool_id}"
        if entry.status in (NodeStatus.BLACKLISTED, NodeStatus.IN_POOL):
            return f"discovery status {entry.status.value}"
        return hardware_shortfall(entry.info.hardware, self.cfg.requirements)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
