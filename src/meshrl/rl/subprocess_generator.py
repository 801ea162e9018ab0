"""Run any rollout generator in a child process, behind the same `RolloutGenerator` interface.

Threads in one process share the GIL: with a 0.8M-parameter policy, most of a step is Python
dispatch, so a generator thread and the trainer mostly take turns instead of overlapping. A
child process (spawned, with its own torch threads) runs generation truly in parallel; the
pipeline's thread only waits on a pipe. Weights travel as a state-dict pickle per version.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import torch

from meshrl.rl.generation import Generated, GenParams

__all__ = ["SubprocessGenerator"]


def _serve(conn: Any, backend: str, model: Any, tokenizer: Any, num_threads: int) -> None:
    from meshrl.rl.generation import make_generator

    torch.set_num_threads(num_threads)
    generator = make_generator(backend, model, tokenizer)
    while True:
        op, *args = conn.recv()
        if op == "close":
            return
        try:
            if op == "load":
                generator.load_weights(args[0])
                conn.send(("ok", None))
            elif op == "generate":
                conn.send(("ok", generator.generate(*args)))
        except Exception as e:  # reported to the caller, the server keeps running
            conn.send(("error", repr(e)))


class SubprocessGenerator:
    """A `RolloutGenerator` whose model lives in a spawned child process."""

    def __init__(self, backend: str, model: Any, tokenizer: Any, num_threads: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, backend, model, tokenizer, num_threads), daemon=True
        )
        self._proc.start()
        child.close()

    def _call(self, *msg: Any) -> Any:
        self._conn.send(msg)
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"generator process: {value}")
        return value

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self._call("load", {k: v.detach().contiguous() for k, v in state_dict.items()})

    def generate(
        self, prompts: list[list[int]], params: GenParams, seq_ids: list[int]
    ) -> list[Generated]:
        return self._call("generate", prompts, params, seq_ids)

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(("close",))
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
