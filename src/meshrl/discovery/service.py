"""The discovery service: nodes announce themselves (signed node info), a pool's manager lists
the nodes that want its pool, and a loop keeps every entry's status in step with the chain.

| route | caller |
| --- | --- |
| `PUT /nodes` | a node added on chain by the provider it names (capped per IP address) |
| `GET /nodes/{address}` | that node |
| `GET /pools/{pool}/nodes` | the pool's manager on chain (its orchestrator) |

Status from the chain: `in_pool` while the node is in a pool; `ejected` once it left a pool
(ejected or left) until it joins again; `blacklisted` when the pool it wants blacklisted it;
otherwise `pending`. Entries of nodes no longer on chain (removed by their provider) disappear.

Every signed request is bound to this registry: its audience is
`meshrl/{chain id}/discovery/{name}/{instance}`, the instance id kept in the registry's database
(beside the nonces it has seen), so one signed for another registry, even one of the same name,
is refused (`wrong_audience`), and fresh (the guard's timestamp window, each nonce once).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from meshrl.discovery.config import DiscoveryConfig
from meshrl.discovery.state import Registry
from meshrl.log import get_logger, log_event
from meshrl.protocol.chain import Protocol
from meshrl.protocol.records import NodeInfo
from meshrl.wire.errors import ErrorCode, WireError
from meshrl.wire.guard import RequestGuard
from meshrl.wire.models import Health, NodeAnnouncement, NodeEntry, NodeList, NodeStatus
from meshrl.wire.nonces import SqliteNonceStore
from meshrl.wire.service import Call, Route, build_app, listen, write_ready_file
from meshrl.wire.signing import discovery_audience

__all__ = ["Discovery"]

log = get_logger("meshrl.discovery")
ZERO = "0x" + "00" * 20
_POOL_ID = re.compile(r"[1-9][0-9]{0,18}", re.ASCII)  # int() takes "1_0" and other scripts' digits


@dataclass(frozen=True)
class ChainStatus:
    """A node's entry status as the chain has it, and the pool it is in (0: none)."""

    status: NodeStatus
    chain_pool: int = 0


class Discovery:
    def __init__(self, cfg: DiscoveryConfig, protocol: Protocol) -> None:
        self.cfg, self.protocol = cfg, protocol
        self.registry = Registry(cfg.db)
        # seen nonces live in the registry's database: a restart does not reopen replays; a
        # request signed for another registry (or chain) is refused. The audience ends in the
        # registry's instance id: two registries that share a name (the default one) keep two
        # nonce stores, so one's signed request would replay at the other within its window
        self.instance = cfg.instance or self.registry.instance_id()
        self.audience = discovery_audience(protocol.backend.chain_id,
                                           f"{cfg.name}/{self.instance}")
        self.guard = RequestGuard(cfg.guard, nonces=SqliteNonceStore(self.registry.db),
                                  audience=self.audience)
        self._chain = ThreadPoolExecutor(1, thread_name_prefix="chain")
        self._managers: dict[int, tuple[str, float]] = {}
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""
        self.syncs = 0  # completed passes of the chain sync (`GET /health`: tests wait on it)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._chain, fn, *args)

    # handlers
    async def health(self, call: Call) -> Health:
        return Health(service="discovery",
                      info={"nodes": self.registry.count(), "syncs": self.syncs,
                            "guard": self.guard.sizes()})

    async def announce(self, call: Call) -> NodeEntry:
        info: NodeAnnouncement = call.body
        node = await self._run(self.protocol.node, call.address)
        if node.provider == ZERO:
            raise WireError(ErrorCode.NODE_NOT_ON_CHAIN, "its provider must add it first")
        if node.provider.lower() != info.provider.lower():
            raise WireError(ErrorCode.PROVIDER_MISMATCH, f"node was added by {node.provider}")
        ip = call.request.remote or ""
        self._check_ip(ip, call.address)  # early, to spare the chain a refused node's lookups
        old = self.registry.get(call.address)
        seen: ChainStatus = (await self._run(self._statuses, [(call.address, info.pool_id, old)],
                                             [node]))[0]
        entry = NodeEntry(address=call.address, info=info, status=seen.status,
                          chain_pool=seen.chain_pool, ip=ip, updated_at=time.time())
        # again, with no await between the count and the write: concurrent announcements
        # from one IP each waited on the chain above, and only here is one of them counted
        self._check_ip(ip, call.address)
        self.registry.put(entry)
        return entry

    def _check_ip(self, ip: str, address: str) -> None:
        if self.registry.count_ip(ip, address) >= self.cfg.max_nodes_per_ip:
            raise WireError(ErrorCode.TOO_MANY_NODES_FOR_IP,
                            f"at most {self.cfg.max_nodes_per_ip}")

    async def own_entry(self, call: Call) -> NodeEntry:
        if call.param("address").lower() != call.address.lower():
            raise WireError(ErrorCode.NOT_OWN_ENTRY)
        entry = self.registry.get(call.address)
        if entry is None:
            raise WireError(ErrorCode.NOT_ANNOUNCED)
        return entry

    async def pool_nodes(self, call: Call) -> NodeList:
        text = call.param("pool_id")
        if not _POOL_ID.fullmatch(text) or int(text) >= 1 << 63:  # what the registry stores
            raise WireError(ErrorCode.BAD_POOL_ID)
        pool = int(text)
        if (await self._manager(pool)).lower() != call.address.lower():
            raise WireError(ErrorCode.NOT_POOL_MANAGER)
        return NodeList(nodes=self.registry.for_pool(pool))

    async def _manager(self, pool: int) -> str:
        hit = self._managers.get(pool)
        if hit is not None and time.monotonic() - hit[1] < self.cfg.manager_cache_s:
            return hit[0]
        manager = (await self._run(self.protocol.pool, pool)).manager
        self._managers[pool] = (manager, time.monotonic())
        return manager

    # chain sync
    def _statuses(self, nodes: list[tuple[str, int, NodeEntry | None]],
                  infos: list[NodeInfo]) -> list[ChainStatus]:
        """The status of each (address, pool wanted, old entry) from its on-chain `infos`; the
        blacklist is read, in one batch, only for nodes in no pool (blocking: runs on the
        chain thread)."""
        free = [i for i, info in enumerate(infos) if info.pool == 0]
        black = dict(zip(free, self.protocol.blacklisted_many(
            [(nodes[i][1], nodes[i][0]) for i in free]), strict=True))
        out = []
        for i, ((_, _, old), info) in enumerate(zip(nodes, infos, strict=True)):
            if info.pool != 0:
                out.append(ChainStatus(NodeStatus.IN_POOL, info.pool))
            elif black[i]:
                out.append(ChainStatus(NodeStatus.BLACKLISTED))
            elif old is not None and old.status in (NodeStatus.IN_POOL, NodeStatus.EJECTED):
                out.append(ChainStatus(NodeStatus.EJECTED))
            else:
                out.append(ChainStatus(NodeStatus.PENDING))
        return out

    def _sync_read(self, entries: list[NodeEntry]) -> list[ChainStatus | None]:
        """Every entry's status (None: gone from the chain) in one or two batched reads,
        not two or three calls per node (blocking: runs on the chain thread)."""
        infos = self.protocol.nodes([e.address for e in entries])
        on = [i for i, info in enumerate(infos) if info.provider != ZERO]
        seen = self._statuses([(entries[i].address, entries[i].info.pool_id, entries[i])
                               for i in on], [infos[i] for i in on])
        out: list[ChainStatus | None] = [None] * len(entries)
        for i, status in zip(on, seen, strict=True):
            out[i] = status
        return out

    async def sync(self) -> int:
        """One pass over the registry; returns how many entries changed or disappeared."""
        changed = 0
        entries = self.registry.all()
        statuses = await self._run(self._sync_read, entries) if entries else []
        for entry, seen in zip(entries, statuses, strict=True):
            if seen is None:
                self.registry.delete(entry.address)
                log_event(log, "node gone from chain", node=entry.address)
                changed += 1
            elif seen != ChainStatus(entry.status, entry.chain_pool):
                self.registry.set_status(entry.address, seen.status, seen.chain_pool)
                changed += 1
        self.syncs += 1
        return changed

    async def _sync_forever(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception as e:  # the chain may be briefly unreachable; retry next round
                log_event(log, "sync error", error=repr(e))
            await asyncio.sleep(self.cfg.sync_s)

    def routes(self) -> list[Route]:
        small = 16 << 10
        return [
            Route("GET", "/health", self.health, response=Health, signed=False,
                  summary="liveness"),
            Route("PUT", "/nodes", self.announce, body=NodeAnnouncement, response=NodeEntry,
                  max_body=small, tags=("node",), summary="announce or update a node",
                  refusals=(ErrorCode.NODE_NOT_ON_CHAIN, ErrorCode.PROVIDER_MISMATCH,
                            ErrorCode.TOO_MANY_NODES_FOR_IP)),
            Route("GET", "/nodes/{address}", self.own_entry, response=NodeEntry, max_body=0,
                  tags=("node",), summary="a node's own entry and status",
                  refusals=(ErrorCode.NOT_OWN_ENTRY, ErrorCode.NOT_ANNOUNCED)),
            Route("GET", "/pools/{pool_id}/nodes", self.pool_nodes, response=NodeList,
                  max_body=0, tags=("orchestrator",),
                  summary="nodes that want this pool (its manager only)",
                  refusals=(ErrorCode.BAD_POOL_ID, ErrorCode.NOT_POOL_MANAGER)),
        ]

    async def start(self) -> None:
        app = build_app("discovery", self.routes(), self.guard)
        self._runner, self.url = await listen(app, self.cfg.host, self.cfg.port)
        self._task = asyncio.create_task(self._sync_forever())
        log_event(log, "discovery listening", url=self.url)
        write_ready_file(self.cfg.ready_file, self.url)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._runner is not None:
            await self._runner.cleanup()
        self._chain.shutdown(wait=False, cancel_futures=True)
        self.registry.close()
