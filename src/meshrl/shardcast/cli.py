"""`meshrl shardcast ...`: publish a version, run an origin or a relay, fetch (or follow)."""

from __future__ import annotations

from typing import Any

from meshrl.shardcast.config import FetchConfig, OriginConfig, PublishConfig, RelayConfig

__all__ = ["register"]


def _publish(cfg: PublishConfig) -> int:
    import json
    import sys
    from pathlib import Path

    from meshrl.shardcast.signing import load_key
    from meshrl.shardcast.store import StoreError, VersionStore

    if not cfg.src:
        print("meshrl shardcast publish: --src is required", file=sys.stderr)
        return 2
    if not Path(cfg.src).exists():
        print(f"meshrl shardcast publish: nothing to publish at {cfg.src}", file=sys.stderr)
        return 1
    if not cfg.key_file:
        print("meshrl shardcast publish: --key_file is required (no relay or client believes "
              "an unsigned manifest)", file=sys.stderr)
        return 2
    if not cfg.run:
        print("meshrl shardcast publish: --run is required (the run id every signed manifest "
              "names, e.g. pool-1)", file=sys.stderr)
        return 2
    try:
        key = load_key(cfg.key_file)
    except (OSError, ValueError) as e:
        print(f"meshrl shardcast publish: cannot read the key {cfg.key_file}: {e}",
              file=sys.stderr)
        return 1
    store = VersionStore(cfg.root, keep=1 << 30, run=cfg.run)  # the running origin prunes
    latest = store.latest()
    version = cfg.version if cfg.version >= 0 else (-1 if latest is None else latest) + 1
    try:
        m = store.publish(cfg.src, version, cfg.shard_size, link=cfg.link,
                          piece_size=cfg.piece_size, key=key)
    except (StoreError, FileNotFoundError) as e:
        print(f"meshrl shardcast publish: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"version": version, "bytes": m.total_size, "shards": len(m.shards),
                      "manifest_sha256": m.digest}))
    return 0


def _origin(cfg: OriginConfig) -> int:
    from meshrl.shardcast.errors import ShardcastError
    from meshrl.shardcast.relay import Origin
    from meshrl.wire.service import serve_forever

    return serve_forever(lambda: Origin(cfg), (ShardcastError,))


def _relay(cfg: RelayConfig) -> int:
    from meshrl.shardcast.errors import ShardcastError
    from meshrl.shardcast.relay import Relay
    from meshrl.wire.service import serve_forever

    return serve_forever(lambda: Relay(cfg), (ShardcastError,))


def _fetch(cfg: FetchConfig) -> int:
    import asyncio
    import json
    import sys

    from meshrl.shardcast.client import ShardcastClient
    from meshrl.shardcast.errors import ShardcastError

    if not cfg.out:
        print("meshrl shardcast fetch: --out is required", file=sys.stderr)
        return 2

    def report(res: Any) -> None:
        print(json.dumps({"version": res.version, "path": str(res.path), "bytes": res.bytes,
                          "seconds": round(res.seconds, 3)}), flush=True)

    async def run() -> None:
        async with ShardcastClient(cfg.server.urls, cfg.client, publisher=cfg.publisher or None,
                                   run=cfg.run or None) as client:
            if cfg.follow:
                await client.follow(cfg.out, report, keep=cfg.keep)
            else:
                report(await client.fetch(cfg.out, None if cfg.version < 0 else cfg.version))

    try:
        asyncio.run(run())
    except ShardcastError as e:
        print(f"meshrl shardcast fetch: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("shardcast", help="broadcast checkpoints through relays")
    sub = group.add_subparsers(dest="shardcast_command", metavar="ACTION", required=True)
    add_config_command(sub, "publish", PublishConfig, _publish,
                       "publish a file or directory as a new version in an origin store")
    add_config_command(sub, "origin", OriginConfig, _origin, "serve an origin store over HTTP")
    add_config_command(sub, "relay", RelayConfig, _relay,
                       "mirror upstream servers (pipelined) and serve their versions")
    add_config_command(sub, "fetch", FetchConfig, _fetch,
                       "download a version (or follow new ones), verified, written atomically")
