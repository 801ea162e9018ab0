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
    "ManifestRefused",
    "OutputWriteError",
    "PublisherRequired",
    "RefusalReason",
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


class RefusalReason(StrEnum):
    """Why one server's answer was not believed."""

    MALFORMED = "malformed"  # not the JSON, types or ranges the protocol says
    TOO_LARGE = "too_large"  # over the bound of its kind of answer
    UNSIGNED = "unsigned"  # a manifest without a signature
    BAD_SIGNATURE = "bad_signature"  # a signature that recovers no key
    WRONG_SIGNER = "wrong_signer"  # signed, but not by the publisher
    WRONG_VERSION = "wrong_version"  # a manifest of another version than asked for
    UNBACKED_VERSION = "unbacked_version"  # listed a version it served no signed manifest of


class UntrustedAnswer(ShardcastError):
    """One server's answer refused: `url` (the server), `reason`, `detail`."""

    def __init__(self, url: str, reason: RefusalReason, detail: str = "") -> None:
        super().__init__(f"shardcast: {url}: refused ({reason})" + (f": {detail}" if detail
                                                                      else ""))
        self.url, self.reason, self.detail = url, reason, detail


class ManifestRefused(UntrustedAnswer):
    """A manifest that is not the publisher's for the version asked for."""
