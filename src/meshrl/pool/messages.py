"""Messages that carry the pool's rules over the wire (built from `meshrl.wire.models.Model`)."""

from __future__ import annotations

from pydantic import Field

from meshrl.pool.rules import PoolRules
from meshrl.wire.models import Model

__all__ = ["WorkOrder"]


class WorkOrder(Model):
    """What a node generates now: the pool's rules, its step, the policy versions a node may
    generate with and where to fetch them."""

    rules: PoolRules
    step: int = Field(ge=0)
    policy_versions: list[int] = Field(max_length=1025, description="versions a node may "
                                       "generate with")
    shardcast_servers: list[str] = Field(max_length=64)
    max_file_bytes: int = Field(ge=1)
    max_units_per_file: int = Field(ge=1)
