"""The worker: untrusted inference that earns (`meshrl worker`).

Names are imported lazily (PEP 562) so `meshrl worker --help` and the configs load without torch.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "WorkerConfig": "config",
    "CheatConfig": "config",
    "KeysConfig": "config",
    "CHEAT_MODES": "config",
    "WorkerKeys": "keys",
    "KeystoreError": "keys",
    "load_keys": "keys",
    "write_keystore": "keys",
    "HardwareInfo": "hardware",
    "probe": "hardware",
    "missing": "hardware",
    "generate_rollouts": "rollouts",
    "Parts": "parts",
    "Outbox": "outbox",
    "OutboxEntry": "outbox",
    "WorkerNode": "node",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.worker", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
