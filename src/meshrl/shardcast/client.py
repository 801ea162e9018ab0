# over 400 lines: one fetch: server choice, parallel verified shards, resumption and the atomic
#  rename share the fetch's state
"""The shardcast client: fetch a version from several servers at once, verified, atomically.

A fetch finds the version (waiting for it if no server has it yet), takes its manifest (only
one signed by `publisher`, the pool's policy signer: no server is believed), then
runs `concurrency` shard workers. Each worker asks the pool for a server holding its shard
(relays that mirror a version announce shards as they verify them) and streams the shard through
a `ShardReceiver`: every piece (1 MiB) is checked against the manifest's sha256 and only then
written at its offset in a temporary output, which is renamed into place when every shard is in.
A broken transfer resumes with `Range` on another server after the last byte received; a bad
piece is fetched again elsewhere. Unverified bytes never reach the disk, each byte is hashed
once, and the memory held is a few pieces per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from meshrl.log import get_logger, log_event
from meshrl.shardcast.adapter import AdapterError, materialize
from meshrl.shardcast.config import ClientConfig
from meshrl.shardcast.delta import DeltaError, reconstruct
from meshrl.shardcast.errors import (
    OutputWriteError,
    PublisherRequired,
    ShardcastError,
    ShardUnavailableError,
)
from meshrl.shardcast.manifest import DELTA_DIR, FULL_DIR, Manifest
from meshrl.shardcast.pool import ServerPool, ServerState
from meshrl.shardcast.signing import check_publisher, check_run
from meshrl.shardcast.store import ShardWriter, file_paths, place_output, verify_files
from meshrl.shardcast.tracker import ServerTracker
from meshrl.shardcast.transport import (
    PROGRESS_HEADER,
    RELAY_HEADER,
    AiohttpTransport,
    PieceMismatchError,
    RawHttpTransport,
    ShardReceiver,
    ShardTransport,
    TransferError,
)

__all__ = ["FetchResult", "ShardcastClient"]

log = get_logger("meshrl.shardcast.client")


@dataclass
class FetchResult:
    version: int
    path: Path
    bytes: int  # of the files placed at `path`
    seconds: float
    servers: dict[str, dict[str, Any]]
    payload: str = "full"  # what was fetched: full, delta (reconstructed on the base), adapter
    fetched_bytes: int = 0  # bytes downloaded
    base: int | None = None  # the version a delta or adapter version was taken against


class ShardcastClient(ServerTracker):
    """Fetches versions from `urls`.

    `publisher` is the checksummed address whose signature a manifest must carry (None: every
    manifest is refused with `PublisherRequired`), `run` the run id it must name (the pool's
    `pool-<id>`; None: every manifest is refused with `RunRequired`). `session` (aiohttp)
    carries the small JSON requests; `transport` moves shard bytes (default: RawHttpTransport
    for http:// servers, see `transport.py`). Both can be injected.
    """

    def __init__(
        self,
        urls: list[str],
        cfg: ClientConfig | None = None,
        session: aiohttp.ClientSession | None = None,
        seed: int | None = None,
        transport: ShardTransport | None = None,
        relay_token: str | None = None,
        publisher: str | None = None,
        run: str | None = None,
    ) -> None:
        cfg = cfg or ClientConfig()
        super().__init__(ServerPool(urls, cfg.failure_decay, seed, cfg.origin_weight), cfg,
                         session, publisher and check_publisher(publisher),
                         run and check_run(run))
        self._progress = 0.0  # of the version being fetched (sent: servers favour the behind)
        self.sync_failures = 0  # follow: versions that did not arrive within sync_timeout
        self.sync_error: str | None = None  # why the last one did not (None once one arrives)
        # a relay says so (X-Shardcast-Relay) and is served before clients
        headers = {RELAY_HEADER: relay_token or "1"} if relay_token is not None else {}
        if transport is None:
            plain = all(u.startswith("http://") for u in urls)
            if self.cfg.transport == "raw" and plain:
                transport = RawHttpTransport(self.cfg.connect_timeout, headers)
            else:
                transport = AiohttpTransport(self.session, headers)
        self.transport = transport

    async def close(self) -> None:
        await self.transport.close()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ShardcastClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- shards -------------------------------------------------------------------------
    async def fetch_shards(
        self,
        m: Manifest,
        sink: Callable[[int, int, memoryview], None],
        on_shard: Callable[[int], None] | None = None,
        only: list[int] | None = None,
    ) -> None:
        """Download every shard of `m` (of the files `only`, indices into `m.files`), passing
        each verified piece to `sink(index, pos, data)`
        (in a worker thread; `pos` is the byte position in the shard). `on_shard(index)` follows
        once all of a shard's pieces went through `sink`.

        `data` is only valid during the call (its buffer is reused for later pieces).
        """
        wanted = None if only is None else set(only)
        pending = [s.index for s in m.shards if wanted is None or s.file in wanted]
        size = sum(m.shards[i].size for i in pending)
        if self.cfg.shard_order == "random":  # spreads clients over the shards relays hold
            self.pool.rng.shuffle(pending)
        deadline = time.monotonic() + self.cfg.wait_timeout
        digest = m.digest  # once: it hashes the whole manifest

        async def next_shard() -> int | None:
            """The first pending shard some server holds now (waiting while none does)."""
            while pending:
                for pos, index in enumerate(pending):
                    if self.pool.available(index, digest):
                        return pending.pop(pos)
                if time.monotonic() > deadline or self._dropped(m.version):
                    raise ShardUnavailableError(f"shardcast: shards {pending[:5]}... of version "
                                                f"{m.version} are held by no reachable server")
                self._avail.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._avail.wait(), self.cfg.poll_interval)
            return None

        async def worker() -> None:
            while (index := await next_shard()) is not None:
                if not await self._get_shard(m, index, functools.partial(sink, index)):
                    pending.append(index)  # only busy servers hold it: take another meanwhile
                    continue
                if on_shard is not None:
                    on_shard(index)
                progress(m.shards[index].size)

        t0, done, step, count = time.monotonic(), [0, 0], max(1, len(pending) // 10), len(pending)
        self._progress = 0.0

        def progress(nbytes: int) -> None:  # one log line per ~10% of the shards
            done[0] += 1
            done[1] += nbytes
            self._progress = done[1] / max(size, 1)
            if done[0] % step == 0 or done[0] == count:
                rate = done[1] / max(time.monotonic() - t0, 1e-9) / 1e6
                log_event(log, "progress", version=m.version, shards=done[0],
                          of=count, mb=round(done[1] / 1e6, 1), mb_per_s=round(rate, 1))

        watchers = [asyncio.create_task(self._watch(s, m)) for s in self.pool.servers.values()]
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(self.cfg.concurrency, count)):
                    tg.create_task(worker())
        except ExceptionGroup as eg:
            raise eg.exceptions[0] from None
        finally:
            for w in watchers:
                w.cancel()

    async def _get_shard(
        self, m: Manifest, index: int, sink: Callable[[int, memoryview], None]
    ) -> bool:
        """Shard `index` through `sink`, verified piece by piece (resumed on another server
        after a failure, a bad piece fetched again from another server). False: no usable
        server holds it now (e.g. the only holder is busy) and nothing of it arrived yet."""
        shard, digest = m.shards[index], m.digest
        digests = [shard.piece_digest(j) for j in range(m.piece_count(shard))]
        rx = ShardReceiver(shard.size, m.piece_size, digests, sink, self.cfg.pieces_in_flight)
        tried, gone = set[str](), self._gone.setdefault(m.version, set())
        attempt, deadline = 0, time.monotonic() + self.cfg.wait_timeout
        again: ServerState | None = None  # the server that sent a slice: asked for the rest
        while attempt < self.cfg.max_attempts:
            s, again = again or self.pool.choose(index, digest, avoid=tried), None
            if s is None:  # nobody usable holds it now (busy, or a relay that held it was lost)
                if rx.filled == 0:
                    return False
                if time.monotonic() > deadline or self._dropped(m.version):
                    break
                self._avail.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._avail.wait(), self.cfg.poll_interval)
                continue
            before = rx.filled
            error = await self._transfer(s, f"{s.url}/v/{m.version}/shard/{index}", rx)
            try:
                await rx.settle()  # raises OutputWriteError at once: retrying cannot help
            except PieceMismatchError as e:
                attempt += 1
                for url in e.sources:
                    self.pool.record_failure(self.pool.servers[url], 3.0, hash_mismatch=True)
                tried |= e.sources
                log_event(log, "shard hash mismatch", servers=sorted(e.sources), shard=index,
                          pos=e.pos)
                continue
            if rx.complete:  # every piece verified and written (even if the link broke after)
                return True
            if error is None and rx.filled > before:  # a slice: the same server for the rest
                again = s
                continue
            if self._refused(s, error):
                continue
            attempt += 1
            self.pool.record_failure(s)
            if isinstance(error, TransferError) and error.status == 404:
                s.complete = False  # it no longer holds the version (pruned, restarted)
                s.have.discard(index)
                gone.add(s.url)
            tried.add(s.url)
            log_event(log, "shard transfer failed", url=s.url, shard=index, error=repr(error))
            delay = self.cfg.backoff * 2 ** (attempt - 1)
            await asyncio.sleep(min(delay, self.cfg.max_backoff))
        raise ShardUnavailableError(f"shardcast: shard {index} of version {m.version} failed "
                                    f"{attempt} times on {sorted(tried) or 'no server'}")

    async def _transfer(self, s: ServerState, url: str, rx: ShardReceiver
                        ) -> BaseException | None:
        """One request to `s` into `rx`; its error, if any. Measures `s`'s throughput."""
        before, start = rx.filled, time.monotonic()
        s.active += 1
        rx.source = s.url
        error: BaseException | None = None
        try:
            await self.transport.fetch(url, rx, self.cfg.stall_timeout,
                                       {PROGRESS_HEADER: f"{self._progress:.4f}"})
        except (OSError, TimeoutError, TransferError, aiohttp.ClientError) as e:
            error = e
        finally:
            s.active -= 1
            got = rx.filled - (before if rx.filled >= before else 0)
            if got:  # a stream cut to serve relays says nothing about the link: bytes only
                self.pool.record_success(s, got, time.monotonic() - start,
                                         measure=not _is_refusal(error))
        return error

    def _refused(self, s: ServerState, error: BaseException | None) -> bool:
        """A server that keeps its upload for relays (403, 503): not a failure."""
        if not _is_refusal(error):
            return False
        assert isinstance(error, TransferError)
        self.pool.record_refusal(s, error.status == 403,
                                 min(error.retry_after or 1e9, self.cfg.busy_backoff))
        return True

    # ---- whole versions -----------------------------------------------------------------
    async def fetch(self, out: str | Path, version: int | None = None,
                    held: Path | None = None) -> FetchResult:
        """Fetch `version` (None: the latest) to `out` (a file or a directory, as published).

        `held` is the directory of the versions held here (`held/v<N>`, as `follow` keeps
        them): a delta version against one of them is fetched as its delta part alone and
        reconstructed on it, bit-exactly, each file checked against the manifest's sha256. A
        delta whose base is not held, or does not match, or that does not reconstruct, is
        fetched as its full part instead (one log line saying why): never wrong weights. The
        previous content of `out` stays intact until the new version is complete.
        """
        t0 = time.monotonic()
        log_event(log, "fetch start", version=version, out=str(out), servers=len(self.pool.servers))
        m = await self.find_manifest(version)
        out = Path(out)
        payload, fetched, effective = m.payload, m.total_size, None
        if m.payload == "delta":
            payload, fetched = await self._fetch_delta(m, out, held)
        elif m.payload == "adapter":
            fetched, effective = await self._fetch_adapter(
                m, out, held if held is not None else out.parent)
        else:
            await self._download(m, out, list(range(len(m.files))), m.kind == "file")
        dt = time.monotonic() - t0
        size = m.part_size(FULL_DIR) if m.payload == "delta" else m.total_size
        if m.payload == "adapter":  # the merged model directory placed at `out`
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        extra = {"effective_sha256": effective} if effective else {}  # what an adapter gave
        log_event(log, "fetched", version=m.version, out=str(out), bytes=size, payload=payload,
                  fetched_bytes=fetched, seconds=round(dt, 3), **extra)
        return FetchResult(m.version, out, size, dt, self.pool.stats(), payload, fetched, m.base)

    async def _fetch_delta(self, m: Manifest, out: Path, held: Path | None
                           ) -> tuple[str, int]:
        """A delta version into `out`: ("delta", bytes) reconstructed on the base version held
        under `held`, else ("full", bytes) of its full part, and why in the log."""
        base = held / f"v{m.base}" if held is not None else None
        if base is None or not base.is_dir():
            why = f"its base version {m.base} is not held"
        else:
            scratch = out.parent / f".{out.name}.delta-{uuid.uuid4().hex[:8]}"
            try:
                await self._download(m, scratch, m.part(DELTA_DIR), False)
                rebuilt = out.parent / f".{out.name}.rebuilt-{uuid.uuid4().hex[:8]}"
                try:
                    await asyncio.to_thread(reconstruct, m, scratch, base, rebuilt)
                    place_output(rebuilt, out)
                finally:
                    shutil.rmtree(rebuilt, ignore_errors=True)
                return "delta", m.part_size(DELTA_DIR)
            except DeltaError as e:  # BaseMismatch included
                why = f"{type(e).__name__}: {e}"
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        log_event(log, "delta unusable, fetching the full checkpoint", level=logging.WARNING,
                  version=m.version, base=m.base, why=why)
        scratch = out.parent / f".{out.name}.full-{uuid.uuid4().hex[:8]}"
        try:
            await self._download(m, scratch, m.part(FULL_DIR), False)
            place_output(scratch / FULL_DIR, out)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return "full", m.part_size(FULL_DIR)

    async def _fetch_adapter(self, m: Manifest, out: Path, held: Path) -> tuple[int, str]:
        """An adapter version into `out` as a full model directory (adapter.py): the adapter's
        files merged onto its base version, held under `held/v<base>` or fetched there first.
        The merged weights must hash to what the version states; a held base that does not
        give them is fetched again once. Returns the bytes fetched. `AdapterError` (one log
        line, `adapter unusable`) when nothing gives them: `out` is then left as it was.
        Returns (bytes fetched, the merged weights' sha256)."""
        base = held / f"v{m.base}"
        fetched = m.total_size
        scratch = out.parent / f".{out.name}.adapter-{uuid.uuid4().hex[:8]}"
        try:
            await self._download(m, scratch, list(range(len(m.files))), False)
            for attempt in (1, 2):
                if attempt == 2 or not (base / "config.json").is_file():
                    fetched += await self._fetch_base(m, base)
                rebuilt = out.parent / f".{out.name}.merged-{uuid.uuid4().hex[:8]}"
                try:
                    digest = await asyncio.to_thread(materialize, scratch, base, rebuilt)
                    place_output(rebuilt, out)
                    return fetched, digest
                except AdapterError as e:
                    log_event(log, "adapter unusable", level=logging.WARNING, version=m.version,
                              base=m.base, attempt=attempt, why=str(e)[:300])
                    if attempt == 2:
                        raise
                finally:
                    shutil.rmtree(rebuilt, ignore_errors=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        raise AssertionError("unreachable")

    async def _fetch_base(self, m: Manifest, base: Path) -> int:
        """The full version an adapter version `m` applies to, into `base` (the digest the
        adapter's signed manifest names, no other)."""
        bm = await self.find_manifest(m.base)
        if bm.digest != m.base_digest or bm.payload != "full":
            raise AdapterError(f"shardcast: version {m.base} served is not the base adapter "
                               f"version {m.version} names")
        log_event(log, "fetching adapter base", version=m.version, base=m.base,
                  bytes=bm.total_size)
        await self._download(bm, base, list(range(len(bm.files))), False)
        return bm.total_size

    async def _download(self, m: Manifest, out: Path, only: list[int], single: bool) -> None:
        """The files `only` of `m` into `out` (the file itself when `single`), verified, via a
        temporary renamed into place when complete."""
        tmp = out.parent / f".{out.name}.shardcast-{uuid.uuid4().hex[:8]}"
        writer = ShardWriter(m, [tmp] if single else file_paths(m, tmp), only)
        try:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                writer.open()
            except OSError as e:
                raise OutputWriteError(f"shardcast: cannot write {out}: {e}") from e
            await self.fetch_shards(m, writer.write_at, only=only)
            try:
                writer.close(sync=self.cfg.fsync)
                if self.cfg.verify_files:
                    paths = [writer.paths[i] for i in only]
                    await asyncio.to_thread(verify_files, m, paths, only)
                place_output(tmp, out)
            except OSError as e:
                raise OutputWriteError(f"shardcast: cannot write {out}: {e}") from e
        finally:
            writer.close(sync=False)
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    async def follow(
        self,
        out_dir: str | Path,
        on_version: Callable[[FetchResult], Awaitable[None] | None],
        after: int = -1,
        keep: int = 2,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Fetch each new version (the newest, skipping stale ones) to `out_dir/v<N>`, then call
        `on_version`; keeps the `keep` newest local versions. Runs until `stop` is set; a
        failed fetch (no server has it, a full disk, every server gone mid-transfer, more than
        `sync_timeout` s) is reported (`version sync failed`, `sync_failures`) and retried
        after a backoff, the versions held untouched; only `PublisherRequired` (nothing could
        ever be believed) ends it. The base of a kept adapter version is kept too."""
        out_dir, stop = Path(out_dir), stop or asyncio.Event()
        failures = 0
        bases: dict[int, int] = {}  # version held -> the version it needs (an adapter's base)
        while not stop.is_set():
            v = None
            try:
                v = await self.wait_for_version(after=after)
                res = await asyncio.wait_for(self.fetch(out_dir / f"v{v}", v, held=out_dir),
                                             self.cfg.sync_timeout)
            except PublisherRequired:
                raise
            except (ShardcastError, TimeoutError) as e:
                failures += 1
                if v is not None:  # a version that exists did not arrive: say so
                    self.sync_failures += 1
                    self.sync_error = (f"timed out after {self.cfg.sync_timeout:g} s"
                                       if isinstance(e, TimeoutError) else str(e)[:300])
                    log_event(log, "version sync failed", level=logging.WARNING, version=v,
                              serving=after, error=self.sync_error, failures=self.sync_failures)
                else:
                    log_event(log, "follow: retrying", error=str(e))
                await asyncio.sleep(min(self.cfg.poll_interval * 2**failures,
                                        self.cfg.max_backoff))
                continue
            self.sync_error = None
            failures = 0
            after = v
            ret = on_version(res)
            if asyncio.iscoroutine(ret):
                await ret
            if res.base is not None and res.payload == "adapter":
                bases[res.version] = res.base
            held = sorted((int(p.name[1:]), p) for p in out_dir.glob("v*") if p.name[1:].isdigit())
            needed = {bases[v] for v, _ in held[-keep:] if v in bases}
            for v, old in held[:-keep]:
                if v in needed:  # the base of a kept adapter version: its next one needs it too
                    continue
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def _is_refusal(error: BaseException | None) -> bool:
    return isinstance(error, TransferError) and error.status in (403, 503)
