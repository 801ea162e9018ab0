"""The discovery service (`meshrl discovery`): nodes announce themselves, pool managers find
candidates, statuses follow the chain. No torch; other roles reach it only over HTTP.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {"Discovery": "service", "DiscoveryConfig": "config", "Registry": "state"}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.discovery", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
