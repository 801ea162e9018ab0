"""A public face for a development chain's JSON-RPC: forwards only standard methods, within
bounds per caller.

A pool on anvil that strangers join must let them read the chain and send their signed
transactions, but anvil also answers `anvil_setBalance`, `anvil_impersonateAccount`, `evm_*`
(time travel, snapshots, reverts), `eth_sendTransaction` / `eth_sendUnsignedTransaction` (sent
as anvil's unlocked accounts, the federator among them), `debug_*`, `txpool_*`, ... Anyone who
reaches them owns the chain. `meshrl chain rpc-filter` listens on a public address and
forwards a call only when it is on the allow list (standard `eth_*` reads,
`eth_sendRawTransaction`, `net_*`, `web3_*`; never a node power or a server-side log filter);
any other call gets a JSON-RPC error of its own, and the rest of a batch still goes through.

Nor is it a free computer (an endless loop with 2^40 gas ran on anvil for about an hour of a
core, long after the filter had given up): a call that runs code gets at most `max_gas` (set
when the caller gave none, so anvil's block gas limit is never the bound). Calls go to the node
one by one, a batch's too, through a `CallerQueue`: at most `per_caller` of one caller's (its
IP) at the node at once, served round robin by caller, so a flood of batches from one address
delays another's call by about one call, not by the flood. A call holds its slot until the node
has answered, even after its caller was told it timed out. Connections go through the services'
connection gate (caps per IP and in all, header and body deadlines): 1,100 half-sent heads
exhausted the plain aiohttp site's descriptors. Bodies and batches are bounded before anything
is parsed or forwarded; the upstream (anvil on loopback) never sees a refused call.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from meshrl.log import get_logger, log_event
from meshrl.protocol.config import STANDARD_METHODS, RpcFilterConfig, never_forwarded
from meshrl.wire.connections import ConnectionGate, GatedSite

__all__ = ["STANDARD_METHODS", "CallerQueue", "QueueFull", "RpcFilter", "RpcFilterConfig",
           "caller_of", "filter_in_thread", "serve_rpc_filter"]

log = get_logger("meshrl.protocol.rpc_filter")

# JSON-RPC 2.0 error codes, and the common server-defined ones for limits and timeouts
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
LIMIT_EXCEEDED, TIMED_OUT = -32005, -32000

# methods that run code on the node: their gas is what bounds its CPU
GAS_METHODS = frozenset({"eth_call", "eth_estimateGas", "eth_createAccessList"})


def _error(id_: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


def caller_of(remote: str | None) -> str:
    """Who a request is from, for the fair queue: its IPv4 address, or its IPv6 /64 (one host
    gets a whole /64 for free)."""
    try:
        ip = ipaddress.ip_address(remote or "")
    except ValueError:
        return remote or ""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class QueueFull(Exception):
    """A caller has `max_waiting` calls queued already."""


class CallerQueue:
    """Slots at the node, shared fairly: at most `slots` calls there at once, at most
    `per_caller` of them one caller's; waiting calls are served round robin by caller (the
    caller just served goes to the back), each caller's in arrival order."""

    def __init__(self, slots: int, per_caller: int, max_waiting: int) -> None:
        self.free, self.per_caller, self.max_waiting = slots, per_caller, max_waiting
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}  # round robin order

    def reserve(self, caller: str, n: int) -> None:
        """Raise `QueueFull` unless `n` more calls of `caller` fit in its queue."""
        if len(self.waiting.get(caller, ())) + n > self.max_waiting:
            raise QueueFull(f"more than {self.max_waiting} calls queued from one address")

    async def acquire(self, caller: str) -> None:
        """Wait for a slot (`QueueFull` at once if `caller` has `max_waiting` calls waiting);
        on cancellation the place in the queue (or the slot) is given up."""
        self.reserve(caller, 1)  # before any await: the bound holds for concurrent requests
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(caller, deque()).append(fut)
        self._dispatch()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(caller)  # granted as it was cancelled
            else:
                q = self.waiting.get(caller)
                if q is not None and fut in q:
                    q.remove(fut)
                    if not q:
                        del self.waiting[caller]
            raise

    def release(self, caller: str) -> None:
        self.free += 1
        left = self.running.pop(caller) - 1
        if left:
            self.running[caller] = left
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0:
            caller = next((c for c in self.waiting
                           if self.running.get(c, 0) < self.per_caller), None)
            if caller is None:
                return
            q = self.waiting.pop(caller)
            fut = q.popleft()
            if q:
                self.waiting[caller] = q  # to the back of the round
            if fut.done():  # cancelled, its task not yet resumed to leave the queue itself
                continue
            self.free -= 1
            self.running[caller] = self.running.get(caller, 0) + 1
            fut.set_result(None)


class RpcFilter:
    """The proxy: `start()` listens (its `url` then set), `stop()` closes."""

    def __init__(self, cfg: RpcFilterConfig) -> None:
        self.cfg = cfg
        self.allow = frozenset(m for m in cfg.allow if not never_forwarded(m))
        self.url = ""
        self.refused = 0  # calls refused, for tests and /health
        self.forwarded = 0
        self.limited = 0  # calls refused for a full queue
        self.timed_out = 0  # calls answered with a timeout
        self.queue = CallerQueue(cfg.slots, cfg.per_caller, cfg.max_waiting)
        self.gate = ConnectionGate(cfg.guard)
        self.dropped: dict[str, int] = {}  # connections closed by the gate, by reason
        self.gate.on_drop = lambda why: self.dropped.__setitem__(why, self.dropped.get(why, 0) + 1)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._inflight: set[asyncio.Task[Any]] = set()

    def _check(self, call: Any) -> dict[str, Any]:
        """`call` as it may go upstream (its gas bounded), or raises `_Refused` with its answer."""
        if not isinstance(call, dict) or not isinstance(call.get("method"), str):
            raise _Refused(_error(None, INVALID_REQUEST, "not a JSON-RPC request"))
        method = call["method"]
        if method not in self.allow:
            raise _Refused(_error(call.get("id"), METHOD_NOT_FOUND,
                                  f"method not allowed on this public endpoint: {method}"))
        if method in GAS_METHODS:
            return self._bound_gas(call)
        return call

    def _bound_gas(self, call: dict[str, Any]) -> dict[str, Any]:
        """The call with its `gas` at most `max_gas`, and set when absent (anvil would take its
        block gas limit); state and block overrides (a third parameter) are not served."""
        params, id_ = call.get("params"), call.get("id")
        if not isinstance(params, list) or not 1 <= len(params) <= 2 \
                or not isinstance(params[0], dict):
            raise _Refused(_error(id_, INVALID_PARAMS, "expected [transaction, block?] (no "
                                  "state or block overrides on this public endpoint)"))
        tx = dict(params[0])
        gas = tx.get("gas", tx.get("gasLimit"))
        try:
            if isinstance(gas, bool | float):
                raise TypeError
            asked = self.cfg.max_gas if gas is None else (
                int(gas, 16) if isinstance(gas, str) else int(gas))
        except (TypeError, ValueError):
            asked = -1
        if asked < 0:
            raise _Refused(_error(id_, INVALID_PARAMS, "gas: not a quantity"))
        tx.pop("gasLimit", None)
        tx["gas"] = hex(min(asked, self.cfg.max_gas))
        return {**call, "params": [tx, *params[1:]]}

    async def _forward(self, call: dict[str, Any]) -> Any:
        assert self._session is not None
        async with self._session.post(self.cfg.upstream, json=call) as r:
            return await r.json(content_type=None)

    async def _one(self, caller: str, call: dict[str, Any], deadline: float) -> Any:
        """One call through the queue, answered by `deadline` (loop time). Its trip to the node
        runs on (holding the slot) when the deadline passes or the caller goes away."""
        id_ = call.get("id")
        try:
            async with asyncio.timeout_at(deadline):
                await self.queue.acquire(caller)
        except TimeoutError:
            self.timed_out += 1
            return _error(id_, TIMED_OUT, "timed out waiting for the node (busy)")
        except QueueFull as e:  # requests of one caller raced for the last places
            self.limited += 1
            return _error(id_, LIMIT_EXCEEDED, str(e))
        task = asyncio.get_running_loop().create_task(self._forward(call))
        self._inflight.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._inflight.discard(t)
            self.queue.release(caller)
            if not t.cancelled():
                t.exception()  # retrieved: an abandoned call's failure is not an error

        task.add_done_callback(done)
        self.forwarded += 1
        try:
            async with asyncio.timeout_at(deadline):
                got = await asyncio.shield(task)
        except TimeoutError:
            self.timed_out += 1
            return _error(id_, TIMED_OUT, f"node did not answer within {self.cfg.timeout_s} s")
        except (aiohttp.ClientError, ValueError) as e:
            log_event(log, "upstream failed", error=repr(e))
            return _error(id_, INTERNAL_ERROR, "upstream unavailable")
        if not isinstance(got, dict):
            return _error(id_, INTERNAL_ERROR, "no upstream answer")
        return got

    async def _read(self, request: web.Request) -> bytes | web.Response:
        """The whole body (however many pieces it comes in) within `max_body` bytes and the
        guard's `body_timeout_s`, else the refusal."""
        limit = self.cfg.max_body
        too_large = web.json_response(_error(None, INVALID_REQUEST, "body too large"),
                                      status=413)
        if request.content_length is not None and request.content_length > limit:
            return too_large
        parts, size = [], 0
        try:
            async with asyncio.timeout(self.cfg.guard.body_timeout_s):
                while chunk := await request.content.read(limit + 1 - size):
                    parts.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        return too_large
        except (TimeoutError, aiohttp.ClientError):
            return web.json_response(_error(None, INVALID_REQUEST, "body unreadable"),
                                     status=400)
        return b"".join(parts)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await self._read(request)
        if isinstance(raw, web.Response):
            return raw
        deadline = asyncio.get_running_loop().time() + self.cfg.timeout_s
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
            return web.json_response(_error(None, PARSE_ERROR, "not JSON"), status=400)
        batch = isinstance(body, list)
        calls = body if batch else [body]
        if batch and not calls:
            return web.json_response(_error(None, INVALID_REQUEST, "empty batch"), status=400)
        if len(calls) > self.cfg.max_batch:
            return web.json_response(_error(None, INVALID_REQUEST,
                                            f"batch longer than {self.cfg.max_batch}"),
                                     status=400)
        answers: list[Any] = []
        passing: list[tuple[int, dict[str, Any]]] = []
        for i, c in enumerate(calls):
            try:
                passing.append((i, self._check(c)))
                answers.append(None)
            except _Refused as r:
                self.refused += 1
                answers.append(r.answer)
        caller = caller_of(request.remote)
        try:  # the whole request at once where it cannot fit (`acquire` checks each call too)
            self.queue.reserve(caller, len(passing))
        except QueueFull as e:
            self.limited += len(passing)
            return web.json_response(_error(None, LIMIT_EXCEEDED, str(e)), status=429)
        got = await asyncio.gather(*(self._one(caller, c, deadline) for _, c in passing))
        for (i, _), g in zip(passing, got, strict=True):
            answers[i] = g
        return web.json_response(answers if batch else answers[0])

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"service": "rpc-filter", "upstream_hidden": True,
                                  "forwarded": self.forwarded, "refused": self.refused,
                                  "limited": self.limited, "timed_out": self.timed_out,
                                  "connections": self.gate.total, "dropped": self.dropped,
                                  # what a request may be, so a client sizes its own (a claim
                                  # picks its batch by these: meshrl.protocol.claiming)
                                  "limits": {"max_body": self.cfg.max_body,
                                             "max_gas": self.cfg.max_gas,
                                             "max_batch": self.cfg.max_batch}})

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.upstream_timeout_s),
            connector=aiohttp.TCPConnector(limit=self.cfg.slots))
        app = web.Application(client_max_size=self.cfg.max_body + 1)
        app.router.add_post("/", self.handle)
        app.router.add_get("/health", self.health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = GatedSite(self._runner, self.gate, self.cfg.host, self.cfg.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.cfg.host}:{port}"
        log_event(log, "rpc filter listening", url=self.url, methods=len(self.allow),
                  max_gas=self.cfg.max_gas)
        if self.cfg.ready_file:
            from pathlib import Path

            Path(self.cfg.ready_file).write_text(self.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        for t in list(self._inflight):
            t.cancel()
        if self._session is not None:
            await self._session.close()


class _Refused(Exception):
    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer["error"]["message"])
        self.answer = answer


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
