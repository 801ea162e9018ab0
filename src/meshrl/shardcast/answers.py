"""What a server may answer to the small JSON requests, bounded and typed.

Every answer is untrusted input: its body is read up to a bound of its kind (more is a
`TOO_LARGE` refusal, never buffered), then validated strictly (types, ranges, lengths; anything
else is `MALFORMED`). A refusal is an `UntrustedAnswer` that costs only the server that sent it.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshrl.shardcast.errors import RefusalReason, UntrustedAnswer
from meshrl.shardcast.manifest import MAX_SHARDS, MAX_VERSION

__all__ = ["MAX_LISTED", "MAX_LISTING_BYTES", "Have", "Listing", "have_bytes", "parse",
           "read_bounded"]

MAX_LISTED = 1024  # versions one listing may name (a store keeps a handful)
MAX_LISTING_BYTES = 64 << 10

Version = Annotated[int, Field(ge=0, le=MAX_VERSION)]
Index = Annotated[int, Field(ge=0, lt=MAX_SHARDS)]


class _Answer(BaseModel):
    # strict: `true` is not a version, "3" is not a shard; unknown keys are a newer server's
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class Listing(_Answer):
    """`GET /versions`."""

    latest: Version | None
    complete: list[Version] = Field(max_length=MAX_LISTED)
    partial: list[Version] = Field(max_length=MAX_LISTED)

    def held(self) -> set[int]:
        return {*self.complete, *self.partial}


class Have(_Answer):
    """`GET /v/N/have`."""

    complete: bool
    have: list[Index] | None = Field(max_length=MAX_SHARDS)
    role: Literal["origin", "relay"] | None = None


def have_bytes(shards: int) -> int:
    """The most bytes a `have` answer of a version of `shards` shards can take."""
    return 256 + 12 * shards


A = TypeVar("A", bound=_Answer)


def parse(model: type[A], body: bytes, url: str) -> A:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])[:80]
        raise UntrustedAnswer(url, RefusalReason.MALFORMED, f"{where}: {err['msg']}") from None


async def read_bounded(r: aiohttp.ClientResponse, limit: int, url: str) -> bytes:
    """The body of `r`, refused (TOO_LARGE) as soon as it is over `limit` bytes."""
    if r.content_length is not None and r.content_length > limit:
        raise UntrustedAnswer(url, RefusalReason.TOO_LARGE,
                              f"{r.content_length} bytes, at most {limit}")
    buf = bytearray()
    async for chunk in r.content.iter_any():
        buf += chunk
        if len(buf) > limit:
            raise UntrustedAnswer(url, RefusalReason.TOO_LARGE, f"over {limit} bytes")
    return bytes(buf)
