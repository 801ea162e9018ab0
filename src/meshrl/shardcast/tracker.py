"""What the servers hold: versions, manifests and shard availability, kept current by polling.

`ServerTracker` is the part of `ShardcastClient` that finds a version (long-polling every
server), takes its manifest and watches each server's `have` while shards download, so the
shard workers always know which server can serve what (and which are origins, which relays).

No server is believed about what a version is. Every answer is bounded and validated
(`answers.py`); a manifest counts only with the publisher's signature for this run and the
version asked for (`signing.py`), and among the authenticated ones the first server in URL order
is taken (servers with another manifest are never used). A server whose answer is refused, or that
lists a version it then serves no signed manifest of, gets a strike: its listings are ignored
for `poll_interval * 2**strikes` s (at most `MAX_DISTRUST`), so one that advertises version
10**15 costs a request now and then, never the honest servers' versions.

"The latest" only moves forward: once a tracker has authenticated version N, a request for the
latest version never takes one older than N from any server (one that withholds N and lists
N-1 is not believed about what is newest: the tracker waits for a server that holds N or newer).
Versions asked for by number (an old one to judge, an adapter's base) are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from meshrl.log import get_logger, log_event
from meshrl.shardcast.answers import (
    MAX_LISTING_BYTES,
    Have,
    Listing,
    have_bytes,
    parse,
    read_bounded,
)
from meshrl.shardcast.config import ClientConfig
from meshrl.shardcast.errors import RefusalReason, UntrustedAnswer, VersionNotFoundError
from meshrl.shardcast.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError
from meshrl.shardcast.pool import ServerPool, ServerState
from meshrl.shardcast.receiver import TransferError
from meshrl.shardcast.signing import check_publisher, check_run, verify_manifest

__all__ = ["MAX_DISTRUST", "ServerTracker"]

log = get_logger("meshrl.shardcast.client")

MAX_DISTRUST = 60.0  # s: the longest a refused server's listings are ignored
_NET_ERRORS = (aiohttp.ClientError, TimeoutError, TransferError)

# what one server said about a version's manifest: the authenticated manifest, a refusal, an
# HTTP answer without one (404...), or nothing (unreachable)
Said = Manifest | UntrustedAnswer | TransferError | None


class ServerTracker:
    def __init__(self, pool: ServerPool, cfg: ClientConfig,
                 session: aiohttp.ClientSession | None = None,
                 publisher: str | None = None, run: str | None = None) -> None:
        self.cfg, self.pool = cfg, pool
        self.publisher, self.run = publisher, run
        # the newest version authenticated so far (-1: none): "the latest" never goes below it
        self.newest = -1
        self._session, self._own_session = session, session is None
        self._avail = asyncio.Event()  # set when a server's availability changed
        # per version: servers that answered 404 for it or moved past it without holding it,
        # and servers that could not be reached while it downloads (watchers keep both)
        self._gone: dict[int, set[str]] = {}
        self._unreachable: dict[int, set[str]] = {}

    def _mark_gone(self, version: int, s: ServerState) -> None:
        self._gone.setdefault(version, set()).add(s.url)
        self._avail.set()  # wake a download waiting for it: it may have to give up

    def _dropped(self, version: int) -> bool:
        """No server can bring `version` back: at least one answered 404 for it or moved past
        it (it was pruned: a newer one replaced it), and every other one is gone as well or
        cannot be reached. Waiting for it would stall a follower that should take the newest."""
        gone = self._gone.get(version, set())
        if not gone:
            return False
        out = gone | self._unreachable.get(version, set())
        return all(url in out for url in self.pool.servers)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            # bodies are counted as they arrive: no server-chosen compression in between
            self._session = aiohttp.ClientSession(connector=conn, auto_decompress=False)
        return self._session

    def _timeout(self, total: float | None = None) -> aiohttp.ClientTimeout:
        c = self.cfg
        return aiohttp.ClientTimeout(total=total, sock_connect=c.connect_timeout,
                                     sock_read=c.stall_timeout)

    async def _get(self, url: str, limit: int, timeout: float | None = None) -> bytes:
        async with self.session.get(url, timeout=self._timeout(timeout)) as r:
            if r.status != 200:
                raise TransferError(f"{url}: HTTP {r.status}", r.status)
            return await read_bounded(r, limit, url)

    def _strike(self, s: ServerState, e: UntrustedAnswer) -> None:
        """`s` sent an answer that cannot be believed: ignore its listings for a while."""
        s.strikes += 1
        s.refusals += 1
        s.distrust_until = time.monotonic() + min(MAX_DISTRUST,
                                                  self.cfg.poll_interval * 2**s.strikes)
        log_event(log, "answer refused", level=logging.WARNING, url=s.url, reason=str(e.reason),
                  detail=e.detail[:200], strikes=s.strikes)

    async def _listing(self, s: ServerState, floor: int, wait: float
                       ) -> tuple[ServerState, Listing | None]:
        url = f"{s.url}/versions?after={floor}&wait={wait:.3f}"
        try:
            body = await self._get(url, MAX_LISTING_BYTES, wait + self.cfg.connect_timeout + 5)
            return s, parse(Listing, body, s.url)
        except UntrustedAnswer as e:
            self._strike(s, e)
        except _NET_ERRORS:
            pass
        return s, None

    # ---- discovery ----------------------------------------------------------------------
    async def wait_for_version(self, version: int | None = None, after: int = -1) -> int:
        """`version` once some server holds it (authenticated), else the newest authenticated
        version > `after` (long-poll)."""
        return (await self.find_manifest(version, after)).version

    async def find_manifest(self, version: int | None = None, after: int = -1) -> Manifest:
        """The authenticated manifest of `version` once some server holds it, else of the
        newest version > `after` some server holds and can back with a signed manifest, and
        never one older than the newest this tracker authenticated before (no rollback)."""
        deadline = time.monotonic() + self.cfg.wait_timeout
        if version is None and self.newest - 1 > after:
            log_event(log, "latest: only versions at least as new as one seen", after=after,
                      newest_seen=self.newest)
            after = self.newest - 1
        floor = version - 1 if version is not None else after
        while True:
            wait = max(0.0, min(deadline - time.monotonic(), self.cfg.long_poll))
            now = time.monotonic()
            asked = [s for s in self.pool.servers.values() if now >= s.distrust_until]
            tasks = [asyncio.create_task(self._listing(s, floor, wait)) for s in asked]
            # every server (none of them ignored) answered, holding only newer versions
            beyond = bool(asked) and len(asked) == len(self.pool.servers)
            try:
                for fut in asyncio.as_completed(tasks):
                    s, listing = await fut
                    if listing is None:
                        beyond = False
                        continue
                    held = listing.held()
                    if version is not None:
                        if version in held and (m := await self._backed(version, s)):
                            return m
                        beyond &= bool(held) and min(held) > version
                        continue
                    newer = [v for v in held if v > after]
                    if newer and (m := await self._backed(max(newer), s)):
                        return m
            finally:
                for t in tasks:
                    t.cancel()
            if version is not None and beyond:
                raise VersionNotFoundError(f"shardcast: version {version} no longer held anywhere")
            if time.monotonic() >= deadline:
                what = f"version {version}" if version is not None else f"a version > {after}"
                if version is None and self.newest > after:
                    what += f" (version {self.newest} was seen: no server holds it now)"
                raise VersionNotFoundError(f"shardcast: {what} did not appear in time")
            await asyncio.sleep(self.cfg.poll_interval)

    async def _backed(self, version: int, lister: ServerState) -> Manifest | None:
        """The authenticated manifest of `version` that `lister` listed, or None. The lister is
        asked first and alone, so a server listing what it cannot back costs one request of
        it (and a strike), never a round of requests to every server."""
        mine = await self._server_manifest(lister, version)
        if isinstance(mine, Manifest):  # the others' now, for who holds what (URL order)
            return _chosen(await self._manifests(version, {lister.url: mine}))
        if not isinstance(mine, UntrustedAnswer):  # a refused manifest has its strike already
            self._strike(lister, UntrustedAnswer(lister.url, RefusalReason.UNBACKED_VERSION,
                                                 f"listed version {version}, then "
                                                 f"{mine or 'no answer'}"))
        return None

    async def get_manifest(self, version: int) -> Manifest:
        """The version's authenticated manifest, from the first server in URL order that serves
        one; VersionNotFoundError if none does."""
        chosen = _chosen(await self._manifests(version))
        if chosen is None:
            raise VersionNotFoundError(f"shardcast: no server serves a manifest of version "
                                       f"{version} signed by {self.publisher}")
        return chosen

    async def _manifests(self, version: int, known: dict[str, Said] | None = None
                         ) -> dict[str, Said]:
        """What every server says of `version`'s manifest (`known`: servers just asked)."""
        check_publisher(self.publisher)
        check_run(self.run)
        known = known or {}
        servers = [s for s in self.pool.servers.values() if s.url not in known]
        for s in servers:
            s.manifest_digest, s.complete, s.have = None, False, set()
        found = await asyncio.gather(*(self._server_manifest(s, version) for s in servers))
        said = {**known, **{s.url: m for s, m in zip(servers, found, strict=True)}}
        said = {url: said[url] for url in self.pool.servers}  # URL order
        chosen = _chosen(said)
        for s in servers:
            if chosen is not None and s.manifest_digest not in (None, chosen.digest):
                log_event(log, "manifest mismatch, server ignored", url=s.url, version=version)
        return said

    async def _server_manifest(self, s: ServerState, version: int) -> Said:
        publisher = check_publisher(self.publisher)  # PublisherRequired: nothing is believed
        run = check_run(self.run)  # RunRequired: another run's versions would be believed
        url = f"{s.url}/v/{version}/manifest"
        try:
            body = await self._get(url, MAX_MANIFEST_BYTES, self.cfg.stall_timeout)
            try:
                m = Manifest.from_json(body)
            except ManifestError as e:
                raise UntrustedAnswer(s.url, RefusalReason.MALFORMED, str(e)) from None
            verify_manifest(m, publisher, version, s.url, run=run)
        except UntrustedAnswer as e:
            self._strike(s, e)
            return e
        except TransferError as e:
            return e if e.status is not None else None  # an answer (404...), or no answer
        except (aiohttp.ClientError, TimeoutError):
            return None
        s.manifest_digest, s.strikes = m.digest, 0  # it backs what it lists
        self.newest = max(self.newest, m.version)
        await self._refresh_have(s, m)
        return m

    async def _refresh_have(self, s: ServerState, m: Manifest) -> None:
        try:
            body = await self._get(f"{s.url}/v/{m.version}/have", have_bytes(len(m.shards)),
                                   self.cfg.stall_timeout)
            self._set_have(s, parse(Have, body, s.url), m)
        except UntrustedAnswer as e:
            self._strike(s, e)
            s.manifest_digest = None  # not used for this version
        except _NET_ERRORS:
            return

    def _set_have(self, s: ServerState, info: Have, m: Manifest) -> None:
        have = set(info.have or ())
        if have and max(have) >= len(m.shards):
            raise UntrustedAnswer(s.url, RefusalReason.MALFORMED,
                                  f"shard {max(have)} of a version of {len(m.shards)} shards")
        before = (s.complete, len(s.have))
        s.complete, s.have = info.complete, have
        s.role = info.role or s.role
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
                    body = await self._get(f"{s.url}/versions?after={v - 1}&wait={lp}",
                                           MAX_LISTING_BYTES, lp + self.cfg.stall_timeout)
                    held = parse(Listing, body, s.url).held()
                    if v in held:
                        if isinstance(await self._server_manifest(s, v), UntrustedAnswer):
                            return  # it serves a manifest nobody signed: never used
                    elif held and max(held) > v:
                        self._mark_gone(v, s)
                        return  # it moved past this version without holding it
                elif s.manifest_digest != m.digest:
                    return  # it serves another manifest for this version: never used
                else:
                    body = await self._get(f"{s.url}/v/{v}/have?known={len(s.have)}&wait={lp}",
                                           have_bytes(len(m.shards)), lp + self.cfg.stall_timeout)
                    self._set_have(s, parse(Have, body, s.url), m)
                    await asyncio.sleep(self.cfg.poll_interval)  # batch the next announcements
                errors = 0
                self._unreachable.get(v, set()).discard(s.url)
            except UntrustedAnswer as e:
                self._strike(s, e)
                s.manifest_digest, s.complete, s.have = None, False, set()
                return  # nothing more of it is believed for this version
            except TransferError as e:
                if e.status == 404:  # it dropped the version (e.g. an aborted mirror)
                    s.manifest_digest, s.complete, s.have = None, False, set()
                    self._mark_gone(v, s)
                errors += 1
            except (aiohttp.ClientError, TimeoutError):
                self._unreachable.setdefault(v, set()).add(s.url)
                self._avail.set()
                errors += 1
            if errors:
                await asyncio.sleep(min(self.cfg.poll_interval * 2**errors, self.cfg.max_backoff))


def _chosen(said: dict[str, Said]) -> Manifest | None:
    """The first authenticated manifest in URL order."""
    return next((m for m in said.values() if isinstance(m, Manifest)), None)
