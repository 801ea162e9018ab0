"""`meshrl dashboard`: serve the live page of a local network."""

from __future__ import annotations

from typing import Any

from meshrl.dashboard.config import DashboardConfig

__all__ = ["register"]


def _serve(cfg: DashboardConfig) -> int:
    from aiohttp import web

    from meshrl.dashboard.app import build_dashboard

    web.run_app(build_dashboard(cfg), host=cfg.host, port=cfg.port, print=None)
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "dashboard", DashboardConfig, _serve,
                       "live web page of a running `meshrl network up` (nodes, versions, curves)")
