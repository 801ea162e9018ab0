"""What a peer may send as a value: JSON numbers finite and within 64 bits, text valid UTF-8.

Python's `json` reads `1e999` as inf, `NaN` as nan, any integer however long, and `"\\ud800"` as a
lone surrogate; none of these can be stored (SQLite, JSON) and served back, and one of them in a
service's state broke every listing, `/health` and sync that read it. So a request body is read
with these refused (`InvalidBody`) before any model sees it; the models bound each field too.
"""

from __future__ import annotations

import json
import math
from typing import Any

from meshrl.wire.errors import ErrorCode, WireError

__all__ = ["load_json", "valid_text"]

_I64 = (-(1 << 63), (1 << 63) - 1)


class _Unservable(ValueError):
    """A JSON value no service could store and serve back."""


def _no_constant(name: str) -> float:
    raise _Unservable(f"{name} is not a number")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e999 parses as inf
        raise _Unservable(f"{text[:20]} is not a finite number")
    return x


def _bounded(text: str) -> int:
    if len(text) > 20:  # wider than 64 bits whatever the digits (and int() of 5000 raises)
        raise _Unservable("an integer outside 64 bits")
    x = int(text)
    if not _I64[0] <= x <= _I64[1]:
        raise _Unservable("an integer outside 64 bits")
    return x


def load_json(raw: bytes) -> Any:
    """A request body as JSON, or `MalformedJson`; then `InvalidBody` for any value a service
    could not store and serve back: a non-finite number, an integer outside 64 bits, a string
    (or key) that is not valid UTF-8 (a lone surrogate)."""
    if not raw:
        return None
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite,
                          parse_int=_bounded)
    except _Unservable as e:
        raise WireError(ErrorCode.INVALID_BODY, str(e)) from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8/16/32, nested too deeply
        raise WireError(ErrorCode.MALFORMED_JSON) from None
    bad = _first_bad_string(data)
    if bad is not None:
        raise WireError(ErrorCode.INVALID_BODY, f"{bad[:200]}: not valid UTF-8 text")
    return data


def _first_bad_string(data: Any) -> str | None:
    """The path of the first string (or key) with a lone surrogate, None if there is none."""
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, str):
            if not valid_text(x):
                return where
        elif isinstance(x, dict):
            for k, v in x.items():
                if not valid_text(k):
                    return where
                stack.append((f"{where}.{k}", v))
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(x))
    return None


def valid_text(text: str) -> bool:
    """Whether `text` is valid UTF-8 text (no lone surrogate: it could not be stored)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
