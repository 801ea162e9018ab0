"""Structured logging: one JSON object per line on stderr, so every service's logs are parseable."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["get_logger", "log_event"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is emitted, not the one at set-up (a
    command run in-process under a redirected or captured stderr must not write to a stale one)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def get_logger(name: str, level: int = logging.INFO) -> logging.Logger:
    """A logger under the `meshrl` hierarchy that writes JSON lines (configured once)."""
    root = logging.getLogger("meshrl")
    if not any(getattr(h, "_meshrl", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_JsonFormatter())
        handler._meshrl = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False
    return logging.getLogger(name if name.startswith("meshrl") else f"meshrl.{name}")


def log_event(logger: logging.Logger, msg: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `msg` with extra structured fields merged into the JSON line."""
    logger.log(level, msg, extra={"fields": {"t": time.time(), **fields}})
