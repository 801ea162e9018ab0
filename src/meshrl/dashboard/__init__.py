"""`meshrl dashboard`: a live web page of a running local network (torch-free).

It reads what the roles publish: `network.json`, the orchestrator's nodes and ledger (signed
with the trainer's reader key), the shardcast servers' `/health`, the trainer's metrics and the
validator's verdicts, and serves them as one JSON document the page polls.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {"DashboardConfig": "config", "build_dashboard": "app", "collect_state": "state"}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.dashboard", _EXPORTS)
