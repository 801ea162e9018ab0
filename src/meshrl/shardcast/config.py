"""Configs of the shardcast roles (origin, relay, client) and of the CLI commands."""

from __future__ import annotations

from typing import Literal

from eth_utils import is_checksum_address
from pydantic import Field, field_validator

from meshrl.config import Config

__all__ = [
    "ClientConfig",
    "FetchConfig",
    "OriginConfig",
    "PublishConfig",
    "RelayConfig",
    "ServerConfig",
    "ServersConfig",
]

MB = 1_000_000
MBIT = 125_000  # bytes/s in one megabit/s


def _publisher(v: str) -> str:
    if v and not is_checksum_address(v):
        raise ValueError(f"{v!r} is not a checksummed Ethereum address")
    return v


RUN = r"^[0-9A-Za-z._:/@+-]{0,128}$"  # manifest.RUN_PATTERN ('' here: not set)
RUN_HELP = ("the run id every manifest must name (the pool's `pool-<id>`): a version of another "
            "run, though signed by the same publisher, is refused")


class ServerConfig(Config):
    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(0, ge=0, le=65535, description="bind port (0: any free port)")
    max_upload_mbps: float = Field(
        0.0, ge=0, description="upload cap over all connections, megabits/s (0: none)")
    max_connection_mbps: float = Field(
        0.0, ge=0, description="upload cap of each connection, megabits/s (0: none)")
    serve_clients: Literal["always", "spare", "never"] = Field(
        "always", description="shards for clients (not relays): always; only with upload "
        "capacity that relays leave unused (needs max_upload_mbps); or never")
    relay_token: str = Field(
        "", description="if set, only requests carrying it in X-Shardcast-Relay count as relays")
    preempt_after: float = Field(
        2.0, gt=0, description="seconds a client's stream may starve behind relays before "
        "it is cut (the client resumes it elsewhere)")
    spare_slice: int = Field(
        1 << 20, gt=0, description="with serve_clients = spare: most bytes of one answer to a "
        "client's Range request (it asks again for the rest, so relays never wait long)")
    chunk_size: int = Field(1 << 20, gt=0, description="bytes per write when streaming a shard")
    scan_interval: float = Field(0.5, gt=0, description="seconds between store re-scans")

    @property
    def upload_rate(self) -> float:
        """max_upload_mbps in bytes/s."""
        return self.max_upload_mbps * MBIT

    @property
    def connection_rate(self) -> float:
        """max_connection_mbps in bytes/s."""
        return self.max_connection_mbps * MBIT


class ClientConfig(Config):
    concurrency: int = Field(4, ge=1, description="shards downloaded at once")
    transport: Literal["raw", "aiohttp"] = Field(
        "raw", description="shard transport: minimal zero-copy HTTP/1.1, or aiohttp"
    )
    pieces_in_flight: int = Field(
        0, ge=0, description="pieces verified in worker threads while the next ones arrive "
        "(0: verify each piece at once on the event loop, the cheapest on few cores)"
    )
    shard_order: Literal["random", "sequential"] = Field(
        "random", description="order in which shards are requested"
    )
    max_attempts: int = Field(20, ge=1, description="attempts per shard before giving up")
    backoff: float = Field(0.05, ge=0, description="first retry delay (s); doubles per attempt")
    max_backoff: float = Field(2.0, ge=0, description="largest retry delay (s)")
    connect_timeout: float = Field(5.0, gt=0, description="seconds to open a connection")
    stall_timeout: float = Field(10.0, gt=0, description="seconds without a byte before retrying")
    poll_interval: float = Field(0.2, gt=0, description="seconds between polls / first backoff")
    long_poll: float = Field(10.0, gt=0, le=60, description="seconds a server may hold a "
                             "long-poll (servers cap it at 60)")
    wait_timeout: float = Field(600.0, ge=0, description="how long to wait for a version to appear")
    sync_timeout: float = Field(
        300.0, gt=0, description="with follow: most seconds one new version may take to "
        "arrive; past it the attempt is abandoned and reported (one line, `sync_failures`), "
        "the newest version held stays in use and the version is tried again after a backoff")
    failure_decay: float = Field(10.0, gt=0, description="seconds for a server failure to fade")
    fsync: bool = Field(True, description="fsync the output before the atomic rename")
    verify_files: bool = Field(False, description="re-hash whole files after the shards verify")
    busy_backoff: float = Field(
        0.5, gt=0, description="most seconds a server that said busy (503) is left alone")
    origin_weight: float = Field(
        0.5, gt=0, description="an origin's share against a relay of equal measured "
        "throughput (< 1: relays are preferred, the origin's link is the scarcest)")


class ServersConfig(Config):
    urls: list[str] = Field(["http://127.0.0.1:8470"], min_length=1, max_length=1024,
                            description="origin / relay base URLs")


class PublishConfig(Config):
    src: str = Field("", description="file or checkpoint directory to publish")
    root: str = Field("runs/shardcast/origin", description="origin store directory")
    version: int = Field(-1, description="version (trainer step); -1: latest + 1")
    shard_size: int = Field(50 * MB, gt=0, description="bytes per shard")
    piece_size: int = Field(1 << 20, gt=0, description="bytes per verified piece of a shard")
    link: bool = Field(False, description="hard-link files into the store instead of copying")
    key_file: str = Field("", description="file holding the publisher's private key (hex): "
                          "the manifest is signed with it (the pool's policy_signer)")
    run: str = Field("", pattern=RUN, description="the run id the signed manifest names (the "
                     "pool's `pool-<id>`); required")


class OriginConfig(Config):
    root: str = Field("runs/shardcast/origin", description="store directory")
    keep: int = Field(5, ge=1, description="versions kept; older ones are deleted once unread")
    run: str = Field("", pattern=RUN, description="the run id of the versions served (the "
                     "pool's `pool-<id>`): a version of another run in the store is never "
                     "served ('': any)")
    server: ServerConfig = ServerConfig(port=8470, serve_clients="spare")


class RelayConfig(Config):
    root: str = Field("runs/shardcast/relay", description="mirror directory")
    keep: int = Field(5, ge=1, description="versions kept")
    upstreams: list[str] = Field(["http://127.0.0.1:8470"], min_length=1, max_length=1024,
                                 description="servers to mirror")
    server: ServerConfig = ServerConfig(port=8471)
    client: ClientConfig = ClientConfig()
    token: str = Field("", description="sent upstream in X-Shardcast-Relay (their relay_token)")
    publisher: str = Field("", description="checksummed address whose signature every mirrored "
                           "manifest must carry (the pool's policy_signer); required")
    run: str = Field("", pattern=RUN, description=RUN_HELP + "; required")

    _publisher = field_validator("publisher")(_publisher)


class FetchConfig(Config):
    server: ServersConfig = ServersConfig()
    client: ClientConfig = ClientConfig()
    version: int = Field(-1, description="version to fetch; -1: the latest")
    out: str = Field("", description="output path (file or directory, as published)")
    follow: bool = Field(False, description="keep fetching new versions into out/v<N>")
    keep: int = Field(2, ge=1, description="with follow: local versions kept")
    publisher: str = Field("", description="checksummed address whose signature the manifest "
                           "must carry (the pool's policy_signer); required")
    run: str = Field("", pattern=RUN, description=RUN_HELP + "; required")

    _publisher = field_validator("publisher")(_publisher)
