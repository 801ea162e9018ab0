"""A public face for a development chain's JSON-RPC: forwards only standard methods.

A pool on anvil that strangers join must let them read the chain and send their signed
transactions, but anvil also answers `anvil_setBalance`, `anvil_impersonateAccount`, `evm_*`
(time travel, snapshots, reverts), `eth_sendTransaction` / `eth_sendUnsignedTransaction` (sent
as anvil's unlocked accounts, the federator among them), `debug_*`, `txpool_*`, ... Anyone who
reaches them owns the chain. `meshrl chain rpc-filter` listens on a public address and
forwards a request only when every call in it is on the allow list (standard `eth_*` reads,
`eth_sendRawTransaction`, `net_*`, `web3_*`); any other call gets a JSON-RPC error of its own,
and the rest of a batch still goes through. Bodies and batches are bounded before anything is
parsed or forwarded; the upstream (anvil on loopback) never sees a refused call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from meshrl.log import get_logger, log_event
from meshrl.protocol.config import STANDARD_METHODS, RpcFilterConfig

__all__ = ["STANDARD_METHODS", "RpcFilter", "RpcFilterConfig", "filter_in_thread",
           "serve_rpc_filter"]

log = get_logger("meshrl.protocol.rpc_filter")

# JSON-RPC 2.0 error codes
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INTERNAL_ERROR = -32700, -32600, -32601, -32603


def _error(id_: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


class RpcFilter:
    """The proxy: `start()` listens (its `url` then set), `stop()` closes."""

    def __init__(self, cfg: RpcFilterConfig) -> None:
        self.cfg = cfg
        self.allow = frozenset(cfg.allow)
        self.url = ""
        self.refused = 0  # calls refused, for tests and /health
        self.forwarded = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def _check(self, call: Any) -> dict[str, Any] | None:
        """None when `call` may go upstream, else its error answer."""
        if not isinstance(call, dict) or not isinstance(call.get("method"), str):
            return _error(None, INVALID_REQUEST, "not a JSON-RPC request")
        if call["method"] not in self.allow:
            self.refused += 1
            return _error(call.get("id"), METHOD_NOT_FOUND,
                          f"method not allowed on this public endpoint: {call['method']}")
        return None

    async def _forward(self, payload: Any) -> Any:
        assert self._session is not None
        async with self._session.post(self.cfg.upstream, json=payload) as r:
            return await r.json(content_type=None)

    async def handle(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > self.cfg.max_body:
            return web.json_response(_error(None, INVALID_REQUEST, "body too large"), status=413)
        try:
            raw = await request.content.read(self.cfg.max_body + 1)
        except (TimeoutError, aiohttp.ClientError):
            return web.json_response(_error(None, INVALID_REQUEST, "body unreadable"),
                                     status=400)
        if len(raw) > self.cfg.max_body:
            return web.json_response(_error(None, INVALID_REQUEST, "body too large"), status=413)
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response(_error(None, PARSE_ERROR, "not JSON"), status=400)
        batch = isinstance(body, list)
        calls = body if batch else [body]
        if batch and not calls:
            return web.json_response(_error(None, INVALID_REQUEST, "empty batch"), status=400)
        if len(calls) > self.cfg.max_batch:
            return web.json_response(_error(None, INVALID_REQUEST,
                                            f"batch longer than {self.cfg.max_batch}"),
                                     status=400)
        answers: list[Any] = [self._check(c) for c in calls]
        passing = [c for c, a in zip(calls, answers, strict=True) if a is None]
        if passing:
            try:
                got = await asyncio.wait_for(
                    self._forward(passing if batch else passing[0]), self.cfg.timeout_s)
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                log_event(log, "upstream failed", error=repr(e))
                err = _error(None, INTERNAL_ERROR, "upstream unavailable")
                got = [err] * len(passing) if batch else err
            self.forwarded += len(passing)
            by_id = {}
            if batch and isinstance(got, list):
                by_id = {json.dumps(g.get("id")): g for g in got if isinstance(g, dict)}
            it = iter([got] if not batch else passing)
            for i, a in enumerate(answers):
                if a is None:
                    call = next(it)
                    answers[i] = call if not batch else by_id.get(
                        json.dumps(call.get("id")),
                        _error(call.get("id"), INTERNAL_ERROR, "no upstream answer"))
        return web.json_response(answers if batch else answers[0])

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"service": "rpc-filter", "upstream_hidden": True,
                                  "forwarded": self.forwarded, "refused": self.refused})

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s))
        app = web.Application(client_max_size=self.cfg.max_body + 1)
        app.router.add_post("/", self.handle)
        app.router.add_get("/health", self.health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.cfg.host}:{port}"
        log_event(log, "rpc filter listening", url=self.url, methods=len(self.allow))
        if self.cfg.ready_file:
            from pathlib import Path

            Path(self.cfg.ready_file).write_text(self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


def filter_in_thread(cfg: RpcFilterConfig,
                     timeout_s: float = 20.0) -> tuple[RpcFilter, Callable[[], None]]:
    """The filter served from a daemon thread with its own event loop, for a synchronous
    caller (`meshrl chain node --public_host`); returns it listening and a `stop()`."""
    import threading

    f, loop, started = RpcFilter(cfg), asyncio.new_event_loop(), threading.Event()
    failed: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(f.start())
        except BaseException as e:  # e.g. the address is taken: handed to the caller
            failed.append(e)
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="rpc-filter", daemon=True)
    thread.start()
    if not started.wait(timeout_s) or failed:
        raise OSError(f"rpc filter did not start on {cfg.host}:{cfg.port}: "
                      f"{failed[0] if failed else 'timed out'}")

    def stop() -> None:
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(f.stop(), loop).result(timeout_s)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)

    return f, stop


def serve_rpc_filter(cfg: RpcFilterConfig) -> int:
    """The command: serve until Ctrl-C / SIGTERM."""
    import contextlib
    import signal

    async def main() -> None:
        f = RpcFilter(cfg)
        await f.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await f.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
