"""Origin and relay services: a VersionStore behind a ShardServer.

The origin serves what `publish` puts in its store (in-process, or from another process: the
server re-scans its root). A relay follows its upstreams and mirrors each new version
*pipelined*: it takes the manifest, announces the version as partial, and serves every shard as
soon as that shard is verified and written, long before the whole version has arrived. When a
relay falls behind it mirrors only the newest version.

A relay believes its upstreams no more than a client does: it mirrors only manifests signed by
its `publisher` for its `run` (never another run's, though signed by the same key), and no
answer of an upstream can end its follow task (a failure is logged and retried after a
backoff; the other upstreams keep it current).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import aiohttp

from meshrl.log import get_logger, log_event
from meshrl.shardcast.client import ShardcastClient
from meshrl.shardcast.config import OriginConfig, RelayConfig
from meshrl.shardcast.manifest import PIECE_SIZE, Manifest
from meshrl.shardcast.server import ShardServer
from meshrl.shardcast.signing import check_publisher, check_run
from meshrl.shardcast.store import StoreError, VersionStore

__all__ = ["Origin", "Relay"]

log = get_logger("meshrl.shardcast.relay")


class Origin:
    """The root of the tree: publishes versions of run `cfg.run` (signed with `key`, the
    publisher's private key) and serves them (none of another run found in its store)."""

    def __init__(self, cfg: OriginConfig, key: str | bytes | None = None) -> None:
        self.cfg, self.key = cfg, key
        self.store = VersionStore(cfg.root, cfg.keep, run=cfg.run or None)
        self.server = ShardServer(self.store, cfg.server, role="origin")

    async def start(self) -> str:
        return await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def publish(
        self, src: str | Path, version: int, shard_size: int = 50_000_000, link: bool = False,
        piece_size: int = PIECE_SIZE, delta_from: int | None = None,
        adapter_of: int | None = None,
    ) -> Manifest:
        """Publish `src` as `version` (hashing and copying happen in a thread); with
        `delta_from`, as a delta against that version (a full one if it is not held); with
        `adapter_of`, the adapter directory `src` for that full version (adapter.py)."""
        if self.key is None:
            raise StoreError("shardcast: an origin publishes only with the publisher's key")
        t0 = time.monotonic()
        if adapter_of is not None:
            m = await asyncio.to_thread(self.store.publish_adapter, src, version, adapter_of,
                                        shard_size, piece_size, self.key)
        elif delta_from is None:
            m = await asyncio.to_thread(self.store.publish, src, version, shard_size, link,
                                        piece_size, self.key)
        else:
            m = await asyncio.to_thread(self.store.publish_delta, src, version, delta_from,
                                        shard_size, piece_size, self.key)
        self.store.prune()
        self.server.notify()
        log_event(log, "published", version=version, payload=m.payload, base=m.base,
                  bytes=m.total_size, fetch_bytes=m.fetch_size, shards=len(m.shards),
                  seconds=round(time.monotonic() - t0, 3))
        return m


class Relay:
    """Mirrors its upstreams' newest versions and serves them (pipelined) to clients."""

    def __init__(self, cfg: RelayConfig, session: aiohttp.ClientSession | None = None) -> None:
        self.cfg = cfg
        publisher = check_publisher(cfg.publisher)  # PublisherRequired: it could believe nothing
        run = check_run(cfg.run)  # RunRequired: it would mirror another run's versions
        # what it mirrored before a restart is served again only if signed for this run
        self.store = VersionStore(cfg.root, cfg.keep, publisher=publisher, run=run)
        self.server = ShardServer(self.store, cfg.server, role="relay")
        self.client = ShardcastClient(cfg.upstreams, cfg.client, session, relay_token=cfg.token,
                                      publisher=publisher, run=run)
        self.mirrored: dict[str, dict[str, float]] = {}
        self.server.info["mirrored"] = self.mirrored
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        url = await self.server.start()
        self._task = asyncio.create_task(self._follow())
        return url

    async def stop(self) -> None:
        """Stop serving (held polls answered at once), then the follower. The follower is
        cancelled until it ends: a cancellation that meets a request's own timeout can come
        out as that timeout, which the follower takes for a failed poll and polls again."""
        await self.server.stop()
        task = self._task
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                task.exception()  # retrieved: a task that failed is not reported at exit
        await self.client.close()

    async def _follow(self) -> None:
        after = self.store.latest() if self.store.latest() is not None else -1
        failures = 0
        while True:
            try:
                m = await self.client.find_manifest(after=after)
                await self.mirror(m)
                after, failures = m.version, 0
            except Exception as e:  # whatever an upstream sent: keep following
                failures += 1
                log_event(log, "mirror failed, retrying", level=logging.WARNING,
                          error=f"{type(e).__name__}: {e}"[:300], failures=failures)
                c = self.cfg.client
                await asyncio.sleep(min(c.poll_interval * 2**failures, max(c.max_backoff, 5.0)))

    async def _mirror_base(self, m: Manifest) -> None:
        """The full version adapter version `m` applies to, mirrored first: a client that
        holds no base fetches it from the relay it fetches the adapter from."""
        base = await self.client.get_manifest(m.base)
        if base.digest != m.base_digest or base.payload != "full":
            raise StoreError(f"shardcast: upstream version {m.base} is not the base adapter "
                             f"version {m.version} names")
        if base.version not in self.store.partial:
            await self.mirror(base)
        again = await self.client.get_manifest(m.version)  # the servers' state is per version
        if again.digest != m.digest:
            raise StoreError(f"shardcast: upstream version {m.version} changed while its base "
                             "was mirrored")

    async def mirror(self, version: int | Manifest) -> None:
        """Mirror `version` (or the version of an authenticated manifest), pipelined."""
        t0 = time.time()
        m = version if isinstance(version, Manifest) else await self.client.get_manifest(version)
        version = m.version
        partial = self.store.begin_partial(m)  # first: pruning keeps its base from now on
        self.server.notify()
        log_event(log, "mirroring", version=version, shards=len(m.shards))

        def on_shard(index: int) -> None:
            partial.have.add(index)  # only now is the shard advertised and served
            self.server.counters["bytes_received"] += m.shards[index].size
            self.server.notify()

        try:
            if m.payload == "adapter" and m.base not in self.store.complete:
                await self._mirror_base(m)
            await self.client.fetch_shards(m, partial.writer.write_at, on_shard)
            await asyncio.to_thread(partial.writer.close, self.store.fsync)
            self.store.commit_partial(version)
        except BaseException:
            self.store.abort_partial(version)
            raise
        self.server.notify()
        self.mirrored[str(version)] = {"start": t0, "complete": time.time()}
        log_event(log, "mirrored", version=version, bytes=m.total_size,
                  seconds=round(time.time() - t0, 3),
                  pipelined_shards=self.server.pipelined.get(version, 0))
