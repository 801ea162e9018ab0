"""Configuration of `meshrl dashboard`."""

from __future__ import annotations

from pydantic import Field

from meshrl.config import Config

__all__ = ["DashboardConfig"]


class DashboardConfig(Config):
    """`meshrl dashboard`: a live page of the network whose run directory is `run`."""

    run: str = Field("runs/network", description="the network's run directory")
    host: str = Field("127.0.0.1", description="listen address (loopback: no auth)")
    port: int = Field(18539, ge=0, lt=65536, description="listen port")
    refresh_s: float = Field(2.0, gt=0, description="seconds between the page's updates")
