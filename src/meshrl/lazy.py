"""Lazy package exports: names resolve (and import their torch-bearing module) on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` importing `name` from `package.<where[name]>`."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__
