"""Plain records the client returns: deployment file, receipts, and decoded contract state."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from meshrl.durable import atomic_write
from meshrl.protocol.events import Event

__all__ = [
    "Deployment",
    "DisputeInfo",
    "NodeInfo",
    "PoolInfo",
    "PoolStatus",
    "ProviderInfo",
    "Receipt",
    "Standing",
    "WorkInfo",
    "WorkStatus",
]


class PoolStatus:
    NONE, PENDING, ACTIVE, COMPLETED = 0, 1, 2, 3


class WorkStatus:
    NONE, SUBMITTED, SOFT_INVALIDATED, HARD_INVALIDATED, CLAIMED, ACCUSED = 0, 1, 2, 3, 4, 5


class Standing:
    """What the verdicts on a provider's node say of one of its items (`Protocol.standing`)."""

    CLEAR, WIPED, DISPUTED = 0, 1, 2


@dataclass(frozen=True)
class Deployment:
    """Where the contracts live; written to a JSON file that every role reads."""

    chain_id: int
    token: str
    protocol: str
    federator: str
    block: int

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Deployment:
        return cls(**json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Receipt:
    tx_hash: str
    block: int
    gas_used: int
    events: list[Event]

    def event(self, name: str) -> Event:
        """The first event called `name` (KeyError if none)."""
        for e in self.events:
            if e.name == name:
                return e
        raise KeyError(f"no {name} event in tx {self.tx_hash}")


@dataclass(frozen=True)
class ProviderInfo:
    registered: bool
    stake: int
    unbonding: int
    unlock_at: int
    compute_units: int


@dataclass(frozen=True)
class NodeInfo:
    provider: str
    compute_units: int
    pool: int


@dataclass(frozen=True)
class PoolInfo:
    domain: int
    manager: str
    status: int
    reward_rate: int
    node_count: int
    max_units: int  # work units one file may claim
    min_interval: int  # seconds between two submissions of one node (0: none)


@dataclass(frozen=True)
class WorkInfo:
    pool: int
    node: str
    provider: str
    units: int
    reward: int
    submitted_at: int
    unlock_at: int
    judge_until: int  # its invalidation window closes then (fixed at submission)
    accusations_before: int  # hard verdicts on its provider's node made before it
    status: int
    count: int = 0  # a batch: the files its root commits to (0: one file)


@dataclass(frozen=True)
class DisputeInfo:
    """A verdict on a work item while it can be disputed, and after."""

    validator: str  # who made it
    at: int  # when
    index: int  # 1 + its number among the provider's hard verdicts on the node; 0: soft
    bond: int  # of the validator's bond, locked until settled (lost if overturned)
    until: int  # challenges and votes are taken until then; it settles then
    challenged: bool
    uphold: int
    overturn: int
    # fixed when the verdict was made (later parameter changes never reach it)
    period: int  # the dispute period (a co-validator's uphold within it confirms the verdict)
    vote_period: int
    quorum: int
    penalty: int  # what an upheld hard verdict slashes
    deposit: int  # what the provider's challenge put at stake (lost if the verdict stands)
    ruling: int  # the federator's on a challenged verdict: 0 none, 1 uphold, 2 overturn

    @property
    def stake(self) -> int:
        """What a vote locks of its voter's bond, and a provider's challenge deposit."""
        return self.bond // 2

    @property
    def hard(self) -> bool:
        return self.index != 0
