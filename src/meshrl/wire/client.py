"""The client helper every role uses: signs each request (EIP-191) and parses typed answers.

`SignedClient(base_url, private_key, audience=...)` wraps an aiohttp session (pass your own to
share one connection pool or to inject a transport). Every request is signed for the service's
audience (meshrl.wire.signing): the one passed, which a role that knows whom it talks to should
pass (`orchestrator_audience(chain_id, pool_id)`), else the one the service names at
`GET /identity`, read once per base URL. JSON bodies are signed over their exact bytes;
uploads are streamed from disk and signed over the file's sha256, which the receiving store
checks while it writes. A non-2xx answer raises the `WireHTTPError` subclass of its code
(`NotInPool`, `StaleWork`, ...; the base class for a code this version does not know); a service
that cannot be reached (refused, reset, timed out) raises `WireUnavailable`, an `OSError`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, overload
from urllib.parse import urlencode

import aiohttp
from pydantic import BaseModel
from yarl import URL

from meshrl.wire.errors import WireUnavailable, WrongAudience, refusal
from meshrl.wire.models import ServiceIdentity
from meshrl.wire.signing import AUDIENCE_RE, UNBOUND_AUDIENCE, address_of, sign_request

__all__ = ["SignedClient", "raise_for"]

M = TypeVar("M", bound=BaseModel)

# base URL -> the audience its service named (one read per process and URL, shared by clients)
_AUDIENCES: dict[str, str] = {}
_ASKING: dict[tuple[int, str], asyncio.Task[str]] = {}


class SignedClient:
    """Signed JSON calls and streamed uploads against one service's base URL."""

    def __init__(
        self,
        base_url: str,
        private_key: bytes | str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 60.0,
        audience: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = private_key
        self.address = address_of(private_key)
        if audience is not None and not AUDIENCE_RE.match(audience):
            raise ValueError(f"not a valid audience: {audience!r}")
        self._audience = audience
        self._own_session = session is None
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> SignedClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def audience(self) -> str:
        """The audience this client signs for: the one given, else the service's own."""
        if self._audience is not None:
            return self._audience
        known = _AUDIENCES.get(self.base_url)
        if known is not None:
            return known
        loop = asyncio.get_running_loop()
        key = (id(loop), self.base_url)  # many clients of one URL ask once
        task = _ASKING.get(key)
        if task is None or task.get_loop() is not loop:
            task = _ASKING[key] = loop.create_task(self._identity())
        try:
            known = await asyncio.shield(task)
        finally:
            if task.done():
                _ASKING.pop(key, None)
        _AUDIENCES[self.base_url] = known
        return known

    async def _identity(self) -> str:
        async with _reachable(self.base_url), self.session.get(
            URL(self.base_url + "/identity", encoded=True)
        ) as resp:
            data = await resp.read()
            if resp.status == 404:  # a service from before audiences: unbound
                return UNBOUND_AUDIENCE
            raise_for(resp.status, data)
        try:
            audience = ServiceIdentity.model_validate_json(data).audience
        except ValueError as e:
            raise WireUnavailable(f"{self.base_url}/identity: not an identity") from e
        if not AUDIENCE_RE.match(audience):
            raise WireUnavailable(f"{self.base_url}/identity: not an audience")
        return audience

    async def _sign(self, method: str, path: str, body: bytes = b"",
                    body_sha256: str | None = None) -> dict[str, str]:
        return sign_request(self._key, method, path, body, body_sha256=body_sha256,
                            address=self.address, audience=await self.audience()).as_dict()

    async def _send(self, method: str, path: str, *, body: bytes | None = None,
                    body_sha256: str | None = None, headers: Mapping[str, str] | None = None,
                    stream: Callable[[], AsyncIterator[bytes]] | None = None) -> bytes:
        """One signed request (`body`, or the bytes `stream()` yields, signed over
        `body_sha256`); the answer's bytes, or its refusal raised. When a learned audience is
        refused (another service now answers at this URL, e.g. a restarted one on a reused
        port), it is read from /identity again and the request sent once more: a refusal is
        unsigned text, so its detail is never believed."""
        url = URL(self.base_url + path, encoded=True)

        async def once() -> bytes:
            signed = await self._sign(method, path, body or b"", body_sha256)
            data = body if stream is None else stream()  # a stream is read anew each time
            async with _reachable(self.base_url), self.session.request(
                method, url, data=data, headers={**signed, **(headers or {})}
            ) as resp:
                answer = await resp.read()
                self._answer(resp.status, answer)
            return answer
        try:
            return await once()
        except WrongAudience:
            if self._audience is not None:  # the caller named it: its mistake, not ours
                raise
            return await once()

    def _answer(self, status: int, data: bytes) -> None:
        try:
            raise_for(status, data)
        except WrongAudience:
            _AUDIENCES.pop(self.base_url, None)  # the service changed: learn it again
            raise

    @overload
    async def call(self, method: str, path: str, body: Any = ..., *, response: type[M],
                   query: Mapping[str, Any] | None = ...) -> M: ...
    @overload
    async def call(self, method: str, path: str, body: Any = ..., *, response: None = ...,
                   query: Mapping[str, Any] | None = ...) -> Any: ...

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        response: type[M] | None = None,
        query: Mapping[str, Any] | None = None,
    ) -> M | Any:
        """Send a signed request with a JSON body (a model, a dict or None); parse the answer."""
        if isinstance(body, BaseModel):
            raw = body.model_dump_json().encode()
        elif body is None:
            raw = b""
        else:
            raw = json.dumps(body).encode()
        path_qs = path + ("?" + urlencode(query) if query else "")
        data = await self._send(method, path_qs, body=raw, headers=(
            {"content-type": "application/json"} if raw else None))
        parsed = json.loads(data) if data else None
        return response.model_validate(parsed) if response is not None else parsed

    async def upload(
        self, method: str, path: str, file: str | Path, sha256: str, *, chunk_size: int = 1 << 20
    ) -> Any:
        """Stream `file` as the body, signed over its declared `sha256` (lower hex)."""
        file = Path(file)
        size = file.stat().st_size
        data = await self._send(
            method, path, body_sha256=sha256, stream=lambda: _chunks(file, chunk_size),
            headers={"content-type": "application/octet-stream", "content-length": str(size)})
        return json.loads(data) if data else None

    async def get_bytes(self, path: str) -> bytes:
        """A signed GET whose answer is raw bytes (a file download)."""
        return await self._send("GET", path)


@asynccontextmanager
async def _reachable(base_url: str) -> AsyncIterator[None]:
    """Transport failures (connection refused or reset, timeouts) as one `WireUnavailable`."""
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as e:
        if isinstance(e, aiohttp.ClientResponseError):
            raise
        raise WireUnavailable(f"{base_url} unreachable: {e or type(e).__name__}") from e


async def _chunks(file: Path, size: int) -> AsyncIterator[bytes]:
    with file.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def raise_for(status: int, data: bytes) -> None:
    """Raise the refusal an answer with `status` and body `data` carries (nothing for a 2xx)."""
    if status < 300:
        return
    try:
        err = json.loads(data)
        reason, code = str(err.get("error", "")), str(err.get("code", ""))
        detail = str(err.get("detail", ""))
    except (ValueError, AttributeError):  # not a service's JSON refusal (a proxy, a crash)
        reason, code, detail = data[:200].decode(errors="replace"), "", ""
    raise refusal(status, code, detail, reason)
