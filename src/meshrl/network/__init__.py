"""`meshrl network`: a whole pool on one machine, as separate supervised role processes.

Torch-free: it only writes role configs and launches `meshrl <role>` processes (and anvil).
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "NetworkConfig": "config",
    "network_up": "up",
    "Supervisor": "supervisor",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.network", _EXPORTS)
