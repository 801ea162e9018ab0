"""Onboarding: read the pool's candidates from discovery, check each on chain and against the
pool's hardware requirements, and sign a one-time, expiring invite the node fetches itself
(`GET /invite`), so nodes behind NAT need no inbound connection. The node then joins on chain;
the `NodeJoined` event makes it a member (see `chainview`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from meshrl.log import get_logger, log_event
from meshrl.orchestrator.chainview import ChainView
from meshrl.orchestrator.config import OnboardingConfig, Requirements
from meshrl.orchestrator.state import State
from meshrl.wire.client import SignedClient
from meshrl.wire.errors import WireHTTPError
from meshrl.wire.models import Hardware, NodeEntry, NodeList, NodeState, NodeStatus

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


@dataclass(frozen=True)
class Refusal:
    reason: str
    until: float  # time.monotonic() when the candidate is looked at again


class Onboarding:
    """Invites the pool's qualifying candidates: reads discovery (signed with `key`, the
    manager's), checks each on `chain`, keeps its invites in `state`."""

    def __init__(self, cfg: OnboardingConfig, pool_id: int, state: State, chain: ChainView,
                 key: bytes | str) -> None:
        self.cfg, self.pool_id, self.state, self.chain, self.key = cfg, pool_id, state, chain, key
        # chain checks are not repeated for every poll of a candidate that cannot join
        self.refused: dict[str, Refusal] = {}
        self._client: SignedClient | None = None

    async def run(self) -> float:
        """One pass over discovery's candidates; returns the delay before the next."""
        if not self.cfg.discovery_url:
            return 3600.0
        if self._client is None:
            self._client = SignedClient(self.cfg.discovery_url, self.key)
        try:
            listing = await self._client.call(
                "GET", f"/pools/{self.pool_id}/nodes", response=NodeList)
        except (WireHTTPError, OSError) as e:
            log_event(log, "discovery unavailable", error=str(e))
            return self.cfg.poll_s
        for entry in listing.nodes:
            await self.consider(entry)
        return self.cfg.poll_s

    async def consider(self, entry: NodeEntry) -> str:
        """Invite `entry` if it qualifies; returns why not ("" when invited or already)."""
        node = entry.address
        row = self.state.node(node)
        if row is not None and row.state is not NodeState.EJECTED:
            return ""
        pending = self.state.invite(node)
        if pending is not None and pending.expiry > time.time() + 30:
            return ""
        last = self.refused.get(node)
        if last is not None and last.until > time.monotonic():
            return last.reason
        why = self._precheck(entry)
        if not why:
            ok = await self.chain.run(self.chain.eligibility, node, entry.info.provider)
            why = ok.reason
        if why:
            if last is None or last.reason != why:
                log_event(log, "candidate refused", node=node, reason=why)
            self.refused[node] = Refusal(why, time.monotonic() + self.cfg.recheck_s)
            return why
        inv = await self.chain.run(self.chain.make_invite, node, self.cfg.invite_ttl_s)
        self.state.put_invite(node, entry.info.provider, inv.nonce, inv.expiry, inv.signature)
        self.refused.pop(node, None)
        log_event(log, "invite signed", node=node, expiry=inv.expiry)
        return ""

    def _precheck(self, entry: NodeEntry) -> str:
        if entry.info.pool_id != self.pool_id:
            return f"wants pool {entry.info.pool_id}"
        if entry.status in (NodeStatus.BLACKLISTED, NodeStatus.IN_POOL):
            return f"discovery status {entry.status.value}"
        return hardware_shortfall(entry.info.hardware, self.cfg.requirements)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
