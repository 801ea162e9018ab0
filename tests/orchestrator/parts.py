"""The orchestrator's HTTP API served from its parts, without an `Orchestrator`, anvil or a
deployment: a State on a temporary SQLite file, a disk store, the pool's step, and a chain view
over an in-process EVM that holds no contracts, so any route that asked the chain would fail
(`chain_untouched` says whether one did)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from eth_account import Account
from eth_utils import keccak
from prometheus_client import CollectorRegistry

from meshrl.orchestrator.api import OrchestratorApi, PoolTerms
from meshrl.orchestrator.chainview import ChainView
from meshrl.orchestrator.config import OrchestratorConfig
from meshrl.orchestrator.metrics import OrchestratorMetrics
from meshrl.orchestrator.state import PoolStep, State
from meshrl.orchestrator.store import DiskFileStore
from meshrl.protocol import Deployment, EthTesterBackend, Protocol
from meshrl.wire.guard import RequestGuard
from meshrl.wire.service import build_app, listen

NOBODY = "0x" + "00" * 20


def key(label: str) -> str:
    return "0x" + keccak(text=f"meshrl-api-parts-{label}").hex()


def address(label: str) -> str:
    return Account.from_key(key(label)).address


@dataclass
class Served:
    url: str
    api: OrchestratorApi
    state: State
    chain: ChainView

    def chain_untouched(self) -> bool:
        """No call reached the chain view's thread (and none was cached)."""
        return not self.chain._validators and not self.chain._pool._threads


def unchained_view(pool_id: int) -> ChainView:
    backend = EthTesterBackend()
    return ChainView(Protocol(backend, Deployment(backend.chain_id, NOBODY, NOBODY, NOBODY, 0)),
                     pool_id, validator_cache_s=0.0)


@contextlib.asynccontextmanager
async def api_from_parts(tmp: Path, cfg: OrchestratorConfig | None = None,
                         readers: tuple[str, ...] = (), max_units: int = 1000,
                         api_type: type[OrchestratorApi] = OrchestratorApi,
                         ) -> AsyncIterator[Served]:
    cfg = cfg or OrchestratorConfig()
    state = State(tmp / "orch.db")
    chain = unchained_view(cfg.pool_id)
    guard = RequestGuard(cfg.guard)
    registry = CollectorRegistry()
    api = api_type(cfg, PoolTerms(domain=1, max_units=max_units), state,
                          DiskFileStore(tmp / "files", fsync=False),
                          PoolStep(state, cfg.work.step, cfg.rules.async_level), chain, readers,
                          OrchestratorMetrics(registry), guard)
    runner: web.AppRunner | None = None
    try:
        runner, url = await listen(build_app("orchestrator", api.routes(), guard,
                                             registry=registry), "127.0.0.1", 0)
        yield Served(url, api, state, chain)
    finally:
        if runner is not None:
            await runner.cleanup()
        chain.close()
        state.close()
