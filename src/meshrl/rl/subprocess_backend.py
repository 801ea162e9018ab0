"""Any inference backend in a child process, behind the same `InferenceBackend` interface.

Threads in one process share the GIL: with a 0.8M-parameter policy, most of a step is Python
dispatch, so a generator thread and the trainer mostly take turns instead of overlapping. A
child process (spawned, with its own torch threads) runs generation truly in parallel; the
pipeline's thread only waits on a pipe. Weights travel through shared memory: the parent copies
a new version into tensors both processes map (a memcpy) and sends only a "load" message; the
child repacks from them before it answers, so the parent never writes while the child reads.
Pickling the state dict through the pipe instead cost ~50 ms per version at 0.8M parameters,
about as much as generating the batch.

The child ignores SIGINT: Ctrl-C reaches the whole foreground process group, and the parent,
not the child, decides how a run stops (it asks the child to close, or terminates it when it
is busy), so a Ctrl-C prints no traceback from the child and no broken pipe in the parent.
"""

from __future__ import annotations

import signal
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
import torch.multiprocessing as mp

from meshrl.inference import Completion, InferenceBackend, SamplingParams, ScoreResult

__all__ = ["SubprocessBackend"]


def _serve(
    conn: Any, kind: str, config: Any, tokenizer: Any, num_threads: int,
    shared: dict[str, torch.Tensor],
) -> None:
    from transformers import AutoModelForCausalLM

    from meshrl.inference import build_backend

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process
    torch.set_num_threads(num_threads)
    # built here rather than unpickled: an HF model unpickled in a spawned process returns no
    # `hidden_states` (its output-capture hooks are installed only by construction)
    model = AutoModelForCausalLM.from_config(config).to(next(iter(shared.values())).dtype)
    model.load_state_dict(shared)
    backend = build_backend(kind, model, tokenizer)  # type: ignore[arg-type]
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nothing left to serve
            return
        if op == "close":
            return
        try:
            if op == "load_shared":
                conn.send(("ok", backend.load_weights(shared, *args)))
            else:
                conn.send(("ok", getattr(backend, op)(*args)))
        except Exception as e:  # reported to the caller with its type; the server keeps running
            e.add_note("in the backend process:\n" + traceback.format_exc())
            try:
                conn.send(("error", e))
            except Exception:  # an exception that does not pickle travels as its text
                conn.send(("error", RuntimeError(f"backend process: {e!r}")))


class SubprocessBackend(InferenceBackend):
    """An `InferenceBackend` of `kind` whose model lives in a spawned child process."""

    def __init__(self, kind: Literal["engine", "reference"], model: Any, tokenizer: Any,
                 num_threads: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._shared = {k: v.detach().clone().share_memory_()
                        for k, v in model.state_dict().items()}
        self._proc = ctx.Process(
            target=_serve, args=(child, kind, model.config, tokenizer, num_threads, self._shared),
            daemon=True,
        )
        with _sigint_ignored():  # inherited: Ctrl-C while the child imports torch is ignored
            self._proc.start()
        child.close()
        self._lock = threading.Lock()  # one call at a time on the pipe; `close` tests it

    def _call(self, *msg: Any) -> Any:
        with self._lock:
            self._conn.send(msg)
            status, value = self._conn.recv()
        if status != "ok":
            raise value
        return value

    def load_weights(self, source: str | Path | dict[str, torch.Tensor], version: int) -> None:
        if isinstance(source, str | Path):
            self._call("load_weights", str(source), version)
            return
        fits = source.keys() == self._shared.keys() and all(
            v.shape == self._shared[k].shape and v.dtype == self._shared[k].dtype
            for k, v in source.items())
        if not fits:  # not this model's layout: ship it whole (the child reports any mismatch)
            self._call("load_weights", {k: v.detach().contiguous() for k, v in source.items()},
                       version)
            return
        with torch.no_grad():
            for k, v in source.items():
                self._shared[k].copy_(v)
        self._call("load_shared", version)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seq_ids: list[int] | None = None
    ) -> list[Completion]:
        return self._call("generate", prompts, params, seq_ids)

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]] | list[Completion],
        temperature: float = 1.0,
        return_hidden_states: bool = True,
        return_logits: bool = False,
    ) -> list[ScoreResult]:
        return self._call("score", prompts, completions, temperature, return_hidden_states,
                          return_logits)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the child process (the backend is unusable afterwards): asked to when it is
        idle; terminated when a call is in flight (that call fails with EOFError), so a stop
        never waits for a whole batch to be generated."""
        if self._proc.is_alive() and self._lock.acquire(blocking=False):
            try:
                self._conn.send(("close",))
            except OSError:  # the child is gone already
                pass
            finally:
                self._lock.release()
            self._proc.join(timeout=timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


@contextmanager
def _sigint_ignored() -> Any:
    """SIGINT ignored meanwhile (from the main thread only: elsewhere signals cannot be set;
    the child then sets it itself once it runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
