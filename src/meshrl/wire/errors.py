"""Typed errors of the wire: every refusal carries an HTTP status and a short reason."""

from __future__ import annotations

__all__ = ["RolloutFileError", "WireError", "WireHTTPError", "WireUnavailable"]


class WireError(Exception):
    """A request refused by a server: `status` is the 4xx code, `reason` the JSON reason."""

    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(f"{status} {reason}" + (f": {detail}" if detail else ""))
        self.status, self.reason, self.detail = status, reason, detail


class WireHTTPError(Exception):
    """A non-2xx answer seen by the client helper (status, the server's reason and detail)."""

    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}" + (f": {detail}" if detail else ""))
        self.status, self.reason, self.detail = status, reason, detail


class WireUnavailable(ConnectionError):
    """The service could not be reached or dropped the connection (refused, reset, timed out):
    transient by nature, so callers that retry catch it with the other `OSError`s."""


class RolloutFileError(ValueError):
    """A rollout file that is not a valid file of this schema (corrupt, truncated, wrong types)."""
