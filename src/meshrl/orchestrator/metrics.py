"""The orchestrator's own Prometheus metrics (served at `/metrics` beside the HTTP ones)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["OrchestratorMetrics"]


class OrchestratorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.heartbeats = Counter("meshrl_orchestrator_heartbeats", "heartbeats received",
                                  registry=registry)
        self.upload_bytes = Counter("meshrl_orchestrator_upload_bytes", "bytes stored",
                                    registry=registry)
        self.ledger_reads = Counter("meshrl_orchestrator_ledger_reads", "SQL reads of the "
                                    "ledger for GET /ledger (held reads share one per change)",
                                    registry=registry)
        self.ejections = Counter("meshrl_orchestrator_ejections", "nodes ejected as dead",
                                 registry=registry)
        self.nodes = Gauge("meshrl_orchestrator_nodes", "nodes by state", ["state"],
                           registry=registry)
        self.files = Gauge("meshrl_orchestrator_files", "ledger files by status", ["status"],
                           registry=registry)
        self.signature_seconds = Gauge("meshrl_orchestrator_signature_seconds",
                                       "time spent recovering request signatures",
                                       registry=registry)
