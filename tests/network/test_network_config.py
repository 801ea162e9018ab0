"""The network's [chain] table changes only the keys it names: the rest keep the local network's
values (verdicts final at once, short periods), never the protocol's own defaults (a one-hour
dispute period, which held every verdict of the demo open and stalled its trainer)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from meshrl.network.config import NETWORK_CHAIN, NetworkConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_a_chain_table_keeps_the_networks_other_values() -> None:
    c = NetworkConfig.model_validate({"chain": {"unbonding_delay": 900}})
    assert c.chain.unbonding_delay == 900
    assert (c.chain.dispute_period, c.chain.verdict_bond) == (0, 0)
    assert c.chain.min_stake == NETWORK_CHAIN.min_stake


def test_the_shipped_network_config_makes_verdicts_final_at_once() -> None:
    raw = tomllib.loads((CONFIGS / "network.toml").read_text())
    c = NetworkConfig.model_validate({"chain": raw["chain"]})
    assert c.chain.dispute_period == 0 and c.chain.verdict_bond == 0
