"""Typed configuration of `meshrl discovery`."""

from __future__ import annotations

from pydantic import Field

from meshrl.config import Config
from meshrl.protocol.config import ChainConfig
from meshrl.wire.guard import GuardConfig

__all__ = ["DiscoveryConfig"]


class DiscoveryConfig(Config):
    name: str = Field("discovery", pattern=r"^[0-9A-Za-z._-]{1,64}$",
                      description="this service's name: requests are signed for "
                      "meshrl/{chain id}/discovery/{name}/{instance}")
    instance: str = Field("", pattern=r"^([0-9A-Za-z._-]{1,24})?$",
                          description="this registry's instance id, the last part of its "
                          "audience: a request signed for one registry is refused by every "
                          "other, even one of the same name ('': a random id made with its "
                          "database and kept in it)")
    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(8500, ge=0, lt=65536, description="listen port (0: any free port)")
    db: str = Field("runs/discovery/nodes.db", description="SQLite registry (WAL)")
    ready_file: str = Field("", description="write {url} here once listening (tests, scripts)")
    max_nodes_per_ip: int = Field(16, ge=1, description="announced nodes per IP address")
    sync_s: float = Field(15.0, gt=0, description="seconds between chain status syncs")
    manager_cache_s: float = Field(30.0, ge=0, description="seconds a pool manager is kept")
    chain: ChainConfig = ChainConfig()
    guard: GuardConfig = GuardConfig()
