"""The trainer across processes: torchrun's world, FSDP2 sharding, and each rank's share.

`meshrl train` under `torchrun --nproc-per-node N` (one host or several) runs one process per
accelerator. Each process holds 1/N of every parameter, gradient and optimizer state
(`torch.distributed.fsdp.fully_shard`, FSDP2: per-parameter sharding with DTensor): a decoder
layer's weights are all-gathered just before its forward (and again in backward), and its
gradients are reduce-scattered right after its backward, so memory per process falls with N.

Why a wrapper module is the FSDP root: the trainer never calls the causal LM's own `forward`
(`packed_logprobs` runs the decoder, then the output head on the picked positions only). FSDP
hooks the forward of the modules it wraps, so the embedding, final norm and (tied) head are
grouped under `PackedPolicy`, whose forward is exactly `packed_logprobs`.

A batch is split between ranks as whole groups (`rank_share`), so packing stays per group and
advantages (computed per group, identically on every rank) need no communication. FSDP
averages gradients over the N ranks; each rank weights a completion's loss by
N / (completions of the whole batch), so the average is the single-process gradient of the
whole batch, up to float summation order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from meshrl.rl.config import DistributedConfig, TrainerConfig
from meshrl.rl.packing import packed_logprobs
from meshrl.rl.trainer import Trainer

__all__ = [
    "FSDPTrainer",
    "PackedPolicy",
    "World",
    "init_world",
    "launched_by_torchrun",
    "mixed_precision_on",
    "rank_share",
    "shard_policy",
]

Micro = tuple[dict[str, torch.Tensor], torch.Tensor, float]


def launched_by_torchrun(env: Mapping[str, str]) -> bool:
    """Was this process started by torchrun (or any launcher that sets its variables)?"""
    return "WORLD_SIZE" in env and "RANK" in env


@dataclass
class World:
    """This process's place in the job: rank, world size, device and the 1-D device mesh."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    mesh: Any

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled; for small control data and batches)."""
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def all_reduce_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def close(self, wait_for_peers: bool = True) -> None:
        """Leave the group. After a normal run every rank first waits at a barrier: a rank that
        tore its gloo connections down while a peer still used them made that peer abort at
        exit ("terminate called without an active exception", SIGABRT; seen twice in CI).
        After an error a peer may be gone, so there is no waiting then."""
        if dist.is_initialized():
            if wait_for_peers:
                dist.barrier()
            dist.destroy_process_group()

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None


def init_world(cfg: DistributedConfig, env: Mapping[str, str]) -> World:
    """Join the process group torchrun describes in `env`: NCCL on GPUs, gloo on CPU."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", "0"))
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("dist.backend = 'nccl' needs CUDA devices; use 'gloo' on CPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=size,
                            timeout=timedelta(seconds=cfg.timeout_s))
    mesh = init_device_mesh(device.type, (size,))
    return World(rank, size, local_rank, device, mesh)


class PackedPolicy(torch.nn.Module):
    """The FSDP root: forward = `packed_logprobs` of the wrapped causal LM (module docstring)."""

    def __init__(self, model: Any, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature

    def forward(self, packed: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return packed_logprobs(self.model, packed, self.temperature)


def mixed_precision_on(cfg: DistributedConfig, device: torch.device) -> bool:
    """Compute in bf16 on `device`? (`auto`: on GPUs only)"""
    return cfg.mixed_precision == "bf16" or (
        cfg.mixed_precision == "auto" and device.type == "cuda"
    )


def shard_policy(model: Any, world: World, cfg: DistributedConfig,
                 temperature: float) -> PackedPolicy:
    """Shard `model` in place (one FSDP unit per decoder layer, the rest in the root) and
    return the root to run it through. Every rank must pass identical weights."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model.to(world.device)
    if cfg.activation_checkpointing:
        # HF recomputes each decoder layer in backward; FSDP2 re-gathers its weights for that
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy()
    if mixed_precision_on(cfg, world.device):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = PackedPolicy(model, temperature)
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=world.mesh, mp_policy=mp,
                    reshard_after_forward=cfg.reshard_after_forward)
    fully_shard(policy, mesh=world.mesh, mp_policy=mp)
    return policy


def rank_share(n_groups: int, rank: int, size: int) -> range:
    """The groups [a, b) of `n_groups` that `rank` trains on: contiguous, sizes differing by at
    most one, all groups covered exactly once."""
    return range(rank * n_groups // size, (rank + 1) * n_groups // size)


class FSDPTrainer(Trainer):
    """`Trainer` over a sharded policy: every rank steps on its share of the batch.

    FSDP's collectives need every rank to run the same number of forward/backward passes, so
    ranks with fewer micro-batches (or none: fewer kept groups than ranks) add passes of weight
    0, which contribute exact zeros to the gradients and metrics."""

    def __init__(self, policy: PackedPolicy, world: World, cfg: TrainerConfig, loss_cfg: Any,
                 temperature: float = 1.0, total_steps: int | None = None) -> None:
        super().__init__(policy.model, cfg, loss_cfg, temperature, total_steps)
        self.policy = policy
        self.world = world

    def logprobs(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(micro)

    def reference_logprobs(self, micro: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if self.reference is not None:  # a plain copy on every rank, on this rank's device
            self.reference.to(self.world.device)
        return super().reference_logprobs(micro)

    def train_share(self, share: dict[str, torch.Tensor], advantages: torch.Tensor,
                    total_rows: int, idle: bool = False) -> dict[str, float]:
        """One optimizer step, this rank holding `share` of a batch of `total_rows` completions;
        `idle`: this rank has no groups and `share` is only a filler for the collectives."""
        micros = self.micro_batches(share, advantages, total_rows)
        if idle:
            micros = [(m, a, 0.0) for m, a, _ in micros[:1]]
        count = self.world.all_reduce_max(len(micros))
        micros += [(micros[0][0], micros[0][1], 0.0)] * (count - len(micros))
        return self.step_on(micros)

    def micro_batches(self, batch: dict[str, torch.Tensor], advantages: torch.Tensor,
                      total_rows: int) -> list[Micro]:
        dev, n = self.world.device, self.world.size  # x n: FSDP averages over the n ranks
        return [({k: v.to(dev) for k, v in m.items()}, a.to(dev), w * n)
                for m, a, w in super().micro_batches(batch, advantages, total_rows)]

    def sum_over_ranks(self, totals: dict[str, float]) -> dict[str, float]:
        keys = list(totals)  # every rank reports the same metric names in the same order
        t = torch.tensor([totals[k] for k in keys], dtype=torch.float64, device=self.world.device)
        dist.all_reduce(t)
        t /= self.world.size  # the weights carried a factor n (micro_batches)
        return dict(zip(keys, t.tolist(), strict=True))
