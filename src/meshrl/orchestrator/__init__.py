"""The orchestrator of one compute pool (`meshrl orchestrator`): onboarding with signed
invites, heartbeats and ejection, work orders, upload slots into a file store, and the ledger
of rollout files that the trainer reads. No torch; it meets other roles only over HTTP and the
chain.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "OrchestratorConfig": "config",
    "Orchestrator": "service",
    "State": "state",
    "DiskFileStore": "store",
    "FileStore": "store",
    "hardware_shortfall": "onboarding",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.orchestrator", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
