"""What the servers hold: versions, manifests and shard availability, kept current by polling.

`ServerTracker` is the part of `ShardcastClient` that finds a version (long-polling every
server), takes its manifest from the first server in URL order (servers with another manifest
are never used) and watches each server's `have` while shards download, so the shard workers
always know which server can serve what (and which are origins, which relays).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from meshrl.log import get_logger, log_event
from meshrl.shardcast.config import ClientConfig
from meshrl.shardcast.errors import VersionNotFoundError
from meshrl.shardcast.manifest import Manifest, ManifestError
from meshrl.shardcast.pool import ServerPool, ServerState
from meshrl.shardcast.receiver import TransferError

__all__ = ["ServerTracker"]

log = get_logger("meshrl.shardcast.client")


class ServerTracker:
    def __init__(self, pool: ServerPool, cfg: ClientConfig,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.cfg, self.pool = cfg, pool
        self._session, self._own_session = session, session is None
        self._avail = asyncio.Event()  # set when a server's availability changed

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=conn)
        return self._session

    def _timeout(self, total: float | None = None) -> aiohttp.ClientTimeout:
        c = self.cfg
        return aiohttp.ClientTimeout(total=total, sock_connect=c.connect_timeout,
                                     sock_read=c.stall_timeout)

    async def _get_json(self, url: str, timeout: float | None = None) -> Any:
        async with self.session.get(url, timeout=self._timeout(timeout)) as r:
            if r.status != 200:
                raise TransferError(f"{url}: HTTP {r.status}", r.status)
            return await r.json(content_type=None)

    # ---- discovery ----------------------------------------------------------------------
    async def wait_for_version(self, version: int | None = None, after: int = -1) -> int:
        """`version` once some server holds it, else the newest version > `after` (long-poll)."""
        deadline = time.monotonic() + self.cfg.wait_timeout
        floor = version - 1 if version is not None else after
        while True:
            wait = max(0.0, min(deadline - time.monotonic(), 10.0))
            urls = list(self.pool.servers)
            tasks = [asyncio.create_task(self._get_json(f"{u}/versions?after={floor}&wait={wait}",
                                                        wait + self.cfg.connect_timeout + 5))
                     for u in urls]
            newest, beyond = None, True
            try:
                for fut in asyncio.as_completed(tasks):
                    try:
                        listing = await fut
                    except (aiohttp.ClientError, TimeoutError, TransferError, ValueError):
                        beyond = False
                        continue
                    held = set(listing["complete"]) | set(listing["partial"])
                    if version is not None and version in held:
                        return version
                    if version is None and held and max(held) > after:
                        return max(held)
                    beyond &= bool(held) and min(held) > (version or 0)
                    newest = listing["latest"] if newest is None else newest
            finally:
                for t in tasks:
                    t.cancel()
            if version is not None and beyond and newest is not None:
                raise VersionNotFoundError(f"shardcast: version {version} no longer held anywhere")
            if time.monotonic() >= deadline:
                what = f"version {version}" if version is not None else f"a version > {after}"
                raise VersionNotFoundError(f"shardcast: {what} did not appear in time")
            await asyncio.sleep(self.cfg.poll_interval)

    async def get_manifest(self, version: int) -> Manifest:
        """The version's manifest, taken from the first server in URL order that serves it."""
        for s in self.pool.servers.values():
            s.manifest_digest, s.complete, s.have = None, False, set()
        found = await asyncio.gather(
            *(self._server_manifest(s, version) for s in self.pool.servers.values()))
        chosen = next((m for m in found if m is not None), None)
        if chosen is None:
            raise VersionNotFoundError(f"shardcast: no server serves manifest {version}")
        for s in self.pool.servers.values():
            if s.manifest_digest not in (None, chosen.digest):
                log_event(log, "manifest mismatch, server ignored", url=s.url, version=version)
        return chosen

    async def _server_manifest(self, s: ServerState, version: int) -> Manifest | None:
        try:
            async with self.session.get(f"{s.url}/v/{version}/manifest",
                                        timeout=self._timeout(self.cfg.stall_timeout)) as r:
                if r.status != 200:
                    return None
                m = Manifest.from_json(await r.read())
        except (aiohttp.ClientError, TimeoutError, ManifestError):
            return None
        if m.version != version:
            return None
        s.manifest_digest = m.digest
        await self._refresh_have(s, version)
        return m

    async def _refresh_have(self, s: ServerState, version: int) -> None:
        try:
            info = await self._get_json(f"{s.url}/v/{version}/have", self.cfg.stall_timeout)
        except (aiohttp.ClientError, TimeoutError, TransferError, ValueError):
            return
        self._set_have(s, info)

    def _set_have(self, s: ServerState, info: dict[str, Any]) -> None:
        before = (s.complete, len(s.have))
        s.complete, s.have = bool(info["complete"]), set(info["have"] or ())
        s.role = info.get("role", s.role)
        if (s.complete, len(s.have)) != before:
            self._avail.set()

    async def _watch(self, s: ServerState, m: Manifest) -> None:
        """Keep one server's availability current while `m` downloads (long-polls, no spinning)."""
        v, lp, errors = m.version, self.cfg.long_poll, 0
        while True:
            try:
                if s.complete and s.manifest_digest == m.digest:
                    await asyncio.sleep(lp)  # nothing to learn unless a shard 404s there
                elif s.manifest_digest is None:  # wait until it holds the version
                    listing = await self._get_json(f"{s.url}/versions?after={v - 1}&wait={lp}",
                                                   lp + self.cfg.stall_timeout)
                    if v in set(listing["complete"]) | set(listing["partial"]):
                        await self._server_manifest(s, v)
                    elif listing["latest"] is not None and listing["latest"] >= v:
                        return  # it moved past this version without holding it
                elif s.manifest_digest != m.digest:
                    return  # it serves another manifest for this version: never used
                else:
                    info = await self._get_json(
                        f"{s.url}/v/{v}/have?known={len(s.have)}&wait={lp}",
                        lp + self.cfg.stall_timeout)
                    self._set_have(s, info)
                    await asyncio.sleep(self.cfg.poll_interval)  # batch the next announcements
                errors = 0
            except TransferError as e:
                if e.status == 404:  # it dropped the version (e.g. an aborted mirror)
                    s.manifest_digest, s.complete, s.have = None, False, set()
                errors += 1
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                errors += 1
            if errors:
                await asyncio.sleep(min(self.cfg.poll_interval * 2**errors, self.cfg.max_backoff))
