"""The trainer's two seams: where its batches come from, and where each new policy goes.

`RLRun.run` (loop.py) sees only these. Behind them: the local pipeline (pipeline.py, a generator
with its own policy copy: it is both), the pool (network_source.py: accepted ledger files in,
shardcast origin out) and, under torchrun, the rank wrappers of dist_run.py around either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from meshrl.rl.rollouts import RolloutBatch

__all__ = ["PolicyPublisher", "RolloutSource", "Weights"]

Weights = dict[str, torch.Tensor]


class RolloutSource(ABC):
    """Batch `step` for step `step`, every rollout in it fresh under the async rule."""

    dropped_stale: int = 0  # batches or files dropped so far as too old for their step

    @abstractmethod
    def get(self, step: int) -> RolloutBatch: ...

    def flow(self) -> dict[str, float]:
        """Numbers of the source's flow for this step's metrics (the pool's: the validator's
        lag, the files' reading time); none for a local source."""
        return {}

    @abstractmethod
    def pending(self, upto: int) -> list[RolloutBatch]:
        """Batches made for steps <= `upto` and not yet taken: what a checkpoint must keep."""

    @abstractmethod
    def close(self) -> None:
        """Stop generating and release what the source holds."""


class PolicyPublisher(ABC):
    """Makes policy `version` (the weights after `version` optimizer steps) the one that
    generates from now on."""

    @abstractmethod
    def publish(self, version: int, weights: Weights) -> None: ...
