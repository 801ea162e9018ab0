"""The parts a worker is built from.

A worker generates with an inference backend, turns an assignment into a rollout file
(`generate_rollouts`), makes the file it puts in its outbox from a work order, and delivers the
file through a courier. `Parts` hands each one over as it is: an honest worker's parts are its
own code. A dishonest worker (`[cheat]`, for tests of the validator) is the honest `WorkerNode`
handed the same parts wrapped by `meshrl.adversaries.worker` (`meshrl adversary worker`), so
the honest path has no cheat branch and imports no cheat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from meshrl.inference import InferenceBackend
from meshrl.pool import Assignment, WorkOrder
from meshrl.tasks import TaskSet
from meshrl.wire.rollout_file import RolloutFile
from meshrl.worker.delivery import Courier
from meshrl.worker.outbox import Outbox, OutboxEntry
from meshrl.worker.rollouts import generate_rollouts

__all__ = ["MadeFile", "MakeFile", "Parts"]

MadeFile = tuple[OutboxEntry, bytes]
# a work order -> the next file for the outbox (None: none to make now)
MakeFile = Callable[[WorkOrder], Awaitable[MadeFile | None]]


class Parts:
    """An honest worker's parts: each method returns what it is given, or the honest code."""

    def backend(self, engine: InferenceBackend, model: Any, tokenizer: Any,
                version: int) -> InferenceBackend:
        """The backend the worker generates with (`engine` holds `model`'s weights, `version`)."""
        return engine

    def rollouts(self, engine: InferenceBackend, tokenizer: Any, a: Assignment, tasks: TaskSet,
                 provider: str) -> RolloutFile:
        """The rollout file of assignment `a`."""
        return generate_rollouts(engine, tokenizer, a, tasks, provider)

    def file_maker(self, make: MakeFile, outbox: Outbox) -> MakeFile:
        """How the worker makes its next file (`make`: the honest way; `outbox`: its files)."""
        return make

    def courier(self, courier: Courier) -> Courier:
        """How the worker's files reach the orchestrator and the chain."""
        return courier

    def challenges(self, which: str) -> str:
        """Which verdicts on its files the worker challenges (an honest one: as configured)."""
        return which
