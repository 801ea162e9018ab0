"""Errors a shardcast fetch raises: each says what failed and leaves the previous output intact."""

from __future__ import annotations

__all__ = ["OutputWriteError", "ShardUnavailableError", "ShardcastError", "VersionNotFoundError"]


class ShardcastError(RuntimeError):
    """A fetch that cannot complete."""


class VersionNotFoundError(ShardcastError):
    """The version did not appear on any server in time (or was already pruned everywhere)."""


class ShardUnavailableError(ShardcastError):
    """A shard failed on every server `max_attempts` times."""


class OutputWriteError(ShardcastError):
    """The output cannot be written (disk full, file too large, no permission)."""
