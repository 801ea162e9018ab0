"""A small service on the shared wire stack, run as its own process by the hostile-peer tests:
it takes every request model of discovery and the orchestrator, stores each accepted body in
SQLite (next to the guard's nonces, as the real services do) and serves them all back.

    python tests/wire/hostile_service.py CONFIG.json

CONFIG: {"db", "ready_file", "audience", "guard": {GuardConfig fields}}. `GET /stored` reads
every stored body back through its model: anything stored that cannot be served is a 500.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from meshrl.wire.guard import GuardConfig, RequestGuard
from meshrl.wire.models import (
    Health,
    Heartbeat,
    LedgerQuery,
    NodeAnnouncement,
    SlotRequest,
    StepUpdate,
    Verdict,
)
from meshrl.wire.nonces import SqliteNonceStore
from meshrl.wire.service import (
    Call,
    Route,
    build_app,
    listen,
    serve_forever,
    write_ready_file,
)

# path -> (method, body model, query model): every model a peer sends to a service
MODELS: dict[str, tuple[str, type[BaseModel] | None, type[BaseModel] | None]] = {
    "/heartbeat": ("POST", Heartbeat, None),
    "/uploads": ("POST", SlotRequest, None),
    "/verdicts": ("POST", Verdict, None),
    "/step": ("POST", StepUpdate, None),
    "/nodes": ("PUT", NodeAnnouncement, None),
    "/ledger": ("GET", None, LedgerQuery),
}


class Stored(BaseModel):
    count: int


class Echo(BaseModel):
    address: str
    body_sha256: str


def main(path: str) -> None:
    cfg = json.loads(Path(path).read_text())
    db = sqlite3.connect(cfg["db"], isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS bodies (route TEXT, json TEXT)")
    guard = RequestGuard(GuardConfig(**cfg.get("guard", {})), nonces=SqliteNonceStore(db),
                         audience=cfg["audience"])

    def store(route: str) -> Any:
        async def handler(call: Call) -> BaseModel:
            model = call.body if call.body is not None else call.query
            db.execute("INSERT INTO bodies VALUES (?, ?)", (route, model.model_dump_json()))
            return model
        return handler

    async def stored(_: Call) -> Stored:
        rows = db.execute("SELECT route, json FROM bodies").fetchall()
        for route, text in rows:
            _, body, query = MODELS[route]
            (body or query).model_validate_json(text)  # type: ignore[union-attr]
        return Stored(count=len(rows))

    async def health(_: Call) -> Health:
        return Health(service="hostile", info=guard.sizes())

    async def echo(call: Call) -> Echo:
        assert call.signer is not None
        return Echo(address=call.address, body_sha256=call.signer.body_sha256)

    routes = [Route("GET", "/health", health, response=Health, signed=False),
              Route("GET", "/stored", stored, response=Stored, signed=False),
              Route("POST", "/echo", echo, response=Echo, max_body=1 << 16)]
    for route, (method, body, query) in MODELS.items():
        routes.append(Route(method, route, store(route), body=body, query=query,
                            response=body or query, max_body=16 << 10))

    class Hostile:
        """Served by `serve_forever`, as a role is: it stops on SIGINT and SIGTERM through the
        loop, even when started from a background job (SIGINT ignored, inherited)."""

        async def start(self) -> None:
            self.runner, url = await listen(build_app("hostile", routes, guard), "127.0.0.1",
                                            int(cfg.get("port", 0)))
            write_ready_file(cfg["ready_file"], url)

        async def stop(self) -> None:
            await self.runner.cleanup()

    serve_forever(Hostile)

if __name__ == "__main__":
    main(sys.argv[1])
