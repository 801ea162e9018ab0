"""Sharded checkpoints (`torch.distributed.checkpoint`) that resume at any world size.

Layout of a checkpoint written under torchrun, `<run>/checkpoints/step_<n>/`:

    model/              the consolidated policy in the HF layout (what shardcast broadcasts
                        and workers load; written by rank 0)
    sharded/            DCP: `.metadata` + one `__<rank>_0.distcp` file per rank, holding the
                        model and AdamW state keyed by parameter name (FQN)
    trainer_state.pt    as in checkpoint.py, less the optimizer (rank 0; written last, so its
                        presence marks the checkpoint complete)

DCP records every tensor's global shape and each shard's offsets, and loading asks only for
the pieces the loading ranks hold, so N ranks resume what M ranks saved, and one plain process
(no process group) resumes it too: `get_state_dict` / `set_state_dict` give the same FQN keys
for a sharded and an unsharded model. Checkpoints must live on storage all ranks share.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from meshrl.rl.checkpoint import TRAINER_STATE, prune_checkpoints

__all__ = [
    "SHARDED_DIR",
    "has_sharded_state",
    "load_sharded_state",
    "save_distributed_checkpoint",
    "save_sharded_state",
    "write_trainer_state",
]

SHARDED_DIR = "sharded"


def has_sharded_state(checkpoint: str | Path) -> bool:
    return (Path(checkpoint) / SHARDED_DIR / ".metadata").is_file()


def save_sharded_state(directory: str | Path, model: Any, optimizer: Any) -> None:
    """Write model + optimizer state with DCP (collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory),
             no_dist=not torch.distributed.is_initialized())


def load_sharded_state(checkpoint: str | Path, model: Any, optimizer: Any) -> None:
    """Load what `save_sharded_state` wrote under `checkpoint/sharded` into this process's
    model and optimizer, whatever the world size was at save time and is now."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(checkpoint) / SHARDED_DIR
    if not has_sharded_state(checkpoint):
        raise FileNotFoundError(f"{directory}: no DCP metadata (not a sharded checkpoint)")
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the layout to fill, in place
    state = {"model": model_sd, "optim": optim_sd}
    single = not torch.distributed.is_initialized()  # one plain process reads every shard
    dcp.load(state, checkpoint_id=str(directory), no_dist=single)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def save_distributed_checkpoint(
    checkpoints_dir: str | Path, step: int, world: Any, model: Any, optimizer: Any,
    write_main: Any, keep: int = 2,
) -> Path:
    """Atomically write `step_<step>`: every rank its DCP shard, then rank 0 calls
    `write_main(tmp_dir)` (HF model + trainer state) and renames the directory into place.
    A kill at any moment leaves the previous checkpoint or the new one, never half of one."""
    root = Path(checkpoints_dir)
    tmp = None
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=root))
    tmp = Path(world.broadcast(str(tmp) if tmp else None))
    final = root / f"step_{step}"
    try:
        save_sharded_state(tmp / SHARDED_DIR, model, optimizer)
        world.barrier()  # every shard is on disk before rank 0 completes the directory
        if world.is_main:
            write_main(tmp)
            if not (tmp / TRAINER_STATE).is_file():
                raise RuntimeError(f"write_main left no {TRAINER_STATE} in {tmp}")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            prune_checkpoints(root, keep)
    except BaseException:
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    world.barrier()
    return final


def write_trainer_state(directory: Path, state: dict[str, Any], step: int) -> None:
    torch.save({**state, "step": step}, directory / TRAINER_STATE)
