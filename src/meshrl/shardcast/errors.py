"""Errors of shardcast: each says what failed and leaves the previous output intact.

A server's answer is untrusted input. One that cannot be believed (a manifest the publisher did
not sign, a listing that is not a listing, a body over its bound) is an `UntrustedAnswer` with a
`RefusalReason`: it costs only that server, and callers branch on the type and the reason,
never on the text.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BadServerUrl",
    "BaseMismatch",
    "DeltaError",
    "DeltaFault",
    "ManifestRefused",
    "OutputWriteError",
    "PublisherRequired",
    "RefusalReason",
    "RunRequired",
    "ShardUnavailableError",
    "ShardcastError",
    "UntrustedAnswer",
    "VersionNotFoundError",
]


class ShardcastError(RuntimeError):
    """A fetch, mirror or publish that cannot complete."""


class VersionNotFoundError(ShardcastError):
    """The version did not appear on any server in time (or was already pruned everywhere)."""


class ShardUnavailableError(ShardcastError):
    """A shard failed on every server `max_attempts` times."""


class OutputWriteError(ShardcastError):
    """The output cannot be written (disk full, file too large, no permission)."""


class BadServerUrl(ShardcastError, ValueError):
    """A server address that is not an http(s) URL of a host (and port)."""


class PublisherRequired(ShardcastError):
    """No publisher address is configured: no manifest can be authenticated, so none is
    believed."""


class RunRequired(PublisherRequired):
    """No run id is configured: a manifest of another run signed by the same publisher could
    not be told apart, so none is believed."""


class RefusalReason(StrEnum):
    """Why one server's answer was not believed."""

    MALFORMED = "malformed"  # not the JSON, types or ranges the protocol says
    TOO_LARGE = "too_large"  # over the bound of its kind of answer
    UNSIGNED = "unsigned"  # a manifest without a signature
    BAD_SIGNATURE = "bad_signature"  # a signature that recovers no key
    WRONG_SIGNER = "wrong_signer"  # signed, but not by the publisher
    WRONG_VERSION = "wrong_version"  # a manifest of another version than asked for
    WRONG_RUN = "wrong_run"  # the publisher's, but of another run (pool) than this one's
    UNBACKED_VERSION = "unbacked_version"  # listed a version it served no signed manifest of


class UntrustedAnswer(ShardcastError):
    """One server's answer refused: `url` (the server), `reason`, `detail`."""

    def __init__(self, url: str, reason: RefusalReason, detail: str = "") -> None:
        super().__init__(f"shardcast: {url}: refused ({reason})" + (f": {detail}" if detail
                                                                      else ""))
        self.url, self.reason, self.detail = url, reason, detail


class ManifestRefused(UntrustedAnswer):
    """A manifest that is not the publisher's for the version asked for."""


class DeltaFault(StrEnum):
    """Why a delta file did not rebuild its target (each a refusal: the client fetches the
    full part)."""

    MALFORMED = "malformed"  # not a delta header, or a sparse delta on a base it cannot fit
    WRONG_TARGET = "wrong_target"  # made for another target than the signed manifest's
    WRONG_BASE = "wrong_base"  # the base held is not the one the delta was made from
    UNDECODABLE = "undecodable"  # the zstd frame does not decompress
    TRUNCATED = "truncated"  # fewer bytes than its own counts say
    OVERSIZED = "oversized"  # more bytes than its counts (or the target size) allow
    BAD_COUNTS = "bad_counts"  # a count over its tensor's size, or one its bitmap belies
    BAD_POSITIONS = "bad_positions"  # positions not strictly increasing or out of range
    HASH_MISMATCH = "hash_mismatch"  # rebuilt bytes that miss the manifest's sha256


class DeltaError(ShardcastError, ValueError):
    """A delta that is malformed, oversized, or does not reconstruct its target (`reason`)."""

    def __init__(self, reason: DeltaFault, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class BaseMismatch(DeltaError):
    """The base held is not the one the delta was made from: fetch the full version."""

    def __init__(self, message: str) -> None:
        super().__init__(DeltaFault.WRONG_BASE, message)
