"""Shardcast: broadcast checkpoints through an HTTP relay tree (origin → relays → workers).

    origin = Origin(OriginConfig(root="store", run="pool-1"), key=trainer_key)  # signs each
    origin_url = await origin.start()
    await origin.publish("model_dir", version=step)
    async with ShardcastClient([origin_url, relay_url], publisher=trainer_address,
                               run="pool-1") as c:      # the pool's run id (signed in each)
        await c.fetch("weights", version=step)       # or c.follow(out_dir, callback)
"""

from meshrl.shardcast.client import FetchResult, ShardcastClient
from meshrl.shardcast.config import (
    ClientConfig,
    FetchConfig,
    OriginConfig,
    PublishConfig,
    RelayConfig,
    ServerConfig,
    ServersConfig,
)
from meshrl.shardcast.errors import (
    ManifestRefused,
    OutputWriteError,
    PublisherRequired,
    RefusalReason,
    RunRequired,
    ShardcastError,
    ShardUnavailableError,
    UntrustedAnswer,
    VersionNotFoundError,
)
from meshrl.shardcast.manifest import FileEntry, Manifest, ManifestError, ShardEntry, build_manifest
from meshrl.shardcast.relay import Origin, Relay
from meshrl.shardcast.server import ShardServer
from meshrl.shardcast.signing import sign_manifest, verify_manifest
from meshrl.shardcast.store import StoreError, VersionStore

__all__ = [
    "ClientConfig",
    "FetchConfig",
    "FetchResult",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "ManifestRefused",
    "Origin",
    "OriginConfig",
    "OutputWriteError",
    "PublishConfig",
    "PublisherRequired",
    "RefusalReason",
    "Relay",
    "RelayConfig",
    "RunRequired",
    "ServerConfig",
    "ServersConfig",
    "ShardEntry",
    "ShardServer",
    "ShardUnavailableError",
    "ShardcastClient",
    "ShardcastError",
    "StoreError",
    "UntrustedAnswer",
    "VersionNotFoundError",
    "VersionStore",
    "build_manifest",
    "sign_manifest",
    "verify_manifest",
]
