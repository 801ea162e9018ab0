"""Pure parts of the orchestrator: the heartbeat miss count and the hardware requirements."""

from __future__ import annotations

import pytest

from meshrl.orchestrator.config import Requirements
from meshrl.orchestrator.onboarding import hardware_shortfall
from meshrl.orchestrator.service import missed_heartbeats
from meshrl.wire.models import Hardware


@pytest.mark.parametrize("silence, missed", [
    (0.0, 0), (10.0, 0), (14.9, 0), (15.1, 1), (24.9, 1), (25.1, 2), (35.1, 3), (95.0, 9),
])
def test_missed_heartbeats(silence: float, missed: int) -> None:
    assert missed_heartbeats(silence, 10.0, 0.5) == missed


def test_missed_heartbeats_without_slack() -> None:
    assert [missed_heartbeats(s, 1.0, 0.0) for s in (0.5, 1.0, 1.01, 2.5, 3.0)] == [0, 0, 1, 2, 3]


def test_hardware_shortfall() -> None:
    req = Requirements(min_cores=4, min_memory_gb=16, min_accelerators=2,
                       min_accelerator_memory_gb=40)
    hw = {"cores": 8, "memory_gb": 64, "accelerators": [
        {"name": "A100", "memory_gb": 80, "count": 1}, {"name": "T4", "memory_gb": 16, "count": 4}]}
    assert "fewer than 2 accelerators" in hardware_shortfall(Hardware(**hw), req)
    hw["accelerators"][0]["count"] = 2
    assert hardware_shortfall(Hardware(**hw), req) == ""
    assert hardware_shortfall(Hardware(**{**hw, "cores": 2}), req) == "2 cores < 4"
    assert "memory" in hardware_shortfall(Hardware(**{**hw, "memory_gb": 8}), req)


def test_shipped_configs_load() -> None:
    from pathlib import Path

    from meshrl.config import load_config
    from meshrl.discovery.config import DiscoveryConfig
    from meshrl.orchestrator.config import OrchestratorConfig

    root = Path(__file__).resolve().parents[2] / "configs"
    o = load_config(OrchestratorConfig, [root / "orchestrator.toml"], ["--pool_id", "2"])
    assert (o.pool_id, o.heartbeat.dead_after, o.rules.task.mix[0].type) == (2, 3, "arithmetic")
    d = load_config(DiscoveryConfig, [root / "discovery.toml"])
    assert d.max_nodes_per_ip == 16
