"""A minimal TOML writer for the role configs the supervisor generates (top-level keys, nested
tables written inline). Strings are JSON-escaped, which TOML basic strings accept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["toml_value", "write_toml"]


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}"
                               for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"toml: cannot write {type(v).__name__}")


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in data.items() if v is not None]
    path.write_text("\n".join(lines) + "\n")
    return path
