"""`meshrl train` under torchrun: the run of loop.py with a sharded policy on every rank.

The algorithm is `RLRun.run`, unchanged; what differs is who does what.

- Rank 0 owns the rollout source and the policy publisher of one process (the pipeline with its
  generator and the `async_level` rule), the metrics file, evaluation, and the consolidated HF
  policy (`host_model`, a plain copy kept on rank 0) that the generator, evaluation and
  checkpoints' `model/` take their weights from.
- Every rank gets each batch from rank 0 (`RankSource.get`), computes the same group
  advantages, and trains on its share of the kept groups (`rank_share`); FSDP reduces the
  gradients.
- Publishing version `s` gathers the full weights (a collective, `RankPublisher`) and rank 0
  hands them to its publisher: the schedule of versions and batches is exactly the
  single-process one.
- The supervised warm-start runs on rank 0's plain copy while the other ranks wait; its result
  is then broadcast into every rank's shards.
- Checkpoints are sharded with DCP (dcp_checkpoint.py) and resume at any world size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from meshrl.config import CommandError
from meshrl.rl.config import RLConfig
from meshrl.rl.distributed import FSDPTrainer, World, init_world, rank_share, shard_policy
from meshrl.rl.loop import RLRun, group_rows
from meshrl.rl.rollouts import RolloutBatch
from meshrl.rl.source import PolicyPublisher, RolloutSource, Weights

__all__ = ["DistributedRun", "RankPublisher", "RankSource", "gather_full", "train_distributed"]


def train_distributed(cfg: RLConfig, env: Mapping[str, str]) -> dict[str, Any]:
    """Join torchrun's process group, run, leave it (also on errors)."""
    world = init_world(cfg.dist, env)
    try:
        result = DistributedRun(cfg, world).run()
    except BaseException:
        world.close(wait_for_peers=False)
        raise
    world.close()
    return result


def gather_full(world: World, weights: Weights) -> Weights:
    """Full CPU tensors of a sharded state dict on rank 0 ({} elsewhere). Collective: every rank
    calls it with the same keys. Tied parameters are gathered once."""
    from torch.distributed.tensor import DTensor

    out: Weights = {}
    seen: dict[int, torch.Tensor] = {}
    for key, value in weights.items():
        if id(value) not in seen:
            full = value.full_tensor() if isinstance(value, DTensor) else value
            seen[id(value)] = full.detach().cpu() if world.is_main else full[:0]
        if world.is_main:
            out[key] = seen[id(value)]
    return out


class RankSource(RolloutSource):
    """Rank 0's rollout source as every rank sees it: rank 0 reads it, the others receive."""

    def __init__(self, world: World, source: RolloutSource | None) -> None:
        if world.is_main != (source is not None):
            raise ValueError("rank 0, and only rank 0, owns the rollout source")
        self.world = world
        self.source = source
        self.dropped_stale = 0  # rank 0's count (0 on the others)

    def get(self, step: int) -> RolloutBatch:
        batch = None
        if self.source is not None:
            batch = self.source.get(step)
            self.dropped_stale = self.source.dropped_stale
        return self.world.broadcast(batch)

    def flow(self) -> dict[str, float]:
        return self.source.flow() if self.source is not None else {}

    def pending(self, upto: int) -> list[RolloutBatch]:
        return self.source.pending(upto) if self.source is not None else []

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


class RankPublisher(PolicyPublisher):
    """Every rank's shards gathered into full weights (a collective), which rank 0 keeps
    (`keep`: for evaluation and checkpoints) and hands to its publisher."""

    def __init__(self, world: World, publisher: PolicyPublisher | None,
                 keep: Callable[[Weights], Weights]) -> None:
        if world.is_main != (publisher is not None):
            raise ValueError("rank 0, and only rank 0, owns the policy publisher")
        self.world, self.publisher, self.keep = world, publisher, keep

    def publish(self, version: int, weights: Weights) -> None:
        full = gather_full(self.world, weights)
        if self.publisher is not None:
            self.publisher.publish(version, self.keep(full))


class DistributedRun(RLRun):
    """`RLRun` on one rank of a torchrun job (module docstring)."""

    def __init__(self, cfg: RLConfig, world: World) -> None:
        self.world = world
        self.latest_weights: Weights | None = None  # rank 0: newest published version, full
        self._latest_serial = 0  # counts `set_latest` calls
        self._host_serial = 0  # the serial of the weights now in host_model (0: none)
        super().__init__(cfg)

    # --------------------------------------------------------------------------- who does what
    def _is_main(self) -> bool:
        return self.world.is_main

    def policy_weights(self) -> Weights:
        """This rank's shards (gathered on rank 0 by the publisher: a collective)."""
        return self.model.state_dict()

    def _attach_lora(self, fresh: bool) -> None:
        """LoRA under torchrun: called by rank 0's warm start (fresh: nothing yet, every rank
        attaches in `_resume_or_warm_start` once the base is saved) or by every rank on resume."""
        if fresh or not self.cfg.lora.enabled:
            return
        self._attach_lora_everywhere(fresh=False)

    def _attach_lora_everywhere(self, fresh: bool) -> None:
        """Every rank: the policy becomes `<run>/base` with adapters (the same on every rank:
        their init is seeded), sharded anew; rank 0 also keeps an unsharded copy of it for
        evaluation, the effective weights and checkpoints (rl/lora.py)."""
        from meshrl.model import load_model, save_model
        from meshrl.rl.lora import LoraPolicy

        base = self.dir / "base"
        if fresh and self.world.is_main:
            save_model(self.host_model, self.tokenizer, base)
        self.world.broadcast(None)  # the base is on the shared run directory for every rank
        if not (base / "config.json").is_file():
            raise CommandError(f"{base}: no LoRA base to resume lora.enabled with (the run "
                               "started without LoRA; start a new run to train adapters)")
        seed = self.cfg.run.seed
        self.model = LoraPolicy(load_model(base), base, self.cfg.lora, seed).model
        self.trainer = self._build_trainer()  # shards the adapted policy; adapters' optimizer
        if self.world.is_main:
            from meshrl.inference import ReferenceBackend

            self.lora = LoraPolicy(load_model(base), base, self.cfg.lora, seed)
            self.host_model = self.lora.model
            self.eval_backend = ReferenceBackend(self.host_model, self.tokenizer)
            self._host_serial = self._latest_serial = 0

    def _host_model(self) -> Any:
        # other ranks never evaluate or save: their eval backend is built but never used
        return copy.deepcopy(self.model) if self.world.is_main else self.model

    def _build_trainer(self) -> FSDPTrainer:
        cfg = self.cfg
        policy = shard_policy(self.model, self.world, cfg.dist, cfg.rollout.temperature)
        return FSDPTrainer(policy, self.world, cfg.trainer, cfg.loss, cfg.rollout.temperature,
                           total_steps=cfg.steps)

    def train_groups(
        self, batch: RolloutBatch, advantages: torch.Tensor, groups: list[int]
    ) -> dict[str, float]:
        g = batch.rewards.shape[1]
        mine = [groups[i] for i in rank_share(len(groups), self.world.rank, self.world.size)]
        rows = group_rows(mine or groups[:1], g)  # no groups here: a filler of weight 0
        return self.trainer.train_share(self.pack(batch, rows), advantages.reshape(-1)[rows],
                                        total_rows=len(groups) * g, idle=not mine)

    def evaluate(self, phase: str, step: int | None = None) -> float:
        if not self.world.is_main:
            return self.accuracy
        self._sync_host()
        return super().evaluate(phase, step)

    def _reached_target(self) -> bool:
        return bool(self.world.broadcast(super()._reached_target()))

    def _finish(self) -> dict[str, Any]:
        self.accuracy = self.world.broadcast(self.accuracy)  # every rank reports rank 0's
        return super()._finish()

    # ------------------------------------------------------------------- start, resume, save
    def _resume_or_warm_start(self) -> list[RolloutBatch]:
        from meshrl.rl.checkpoint import latest_checkpoint

        found = None
        if self.world.is_main and self.cfg.run.resume:
            found = latest_checkpoint(self.dir / "checkpoints")
        ckpt = self.world.broadcast(str(found) if found else None)
        if ckpt is None:
            if self.world.is_main:
                super()._warm_start()  # saves the KL reference policy when there is one
            self._broadcast_host(optimizer_state=None)
            if not self.world.is_main:
                self._keep_reference(fresh=False)  # rank 0 saved it before the broadcast
            if self.cfg.lora.enabled:
                self._attach_lora_everywhere(fresh=True)
            return []
        return self._resume(Path(ckpt))

    def _restore_weights(self, ckpt: Path, state: dict[str, Any]) -> None:
        from meshrl.rl.dcp_checkpoint import has_sharded_state

        if has_sharded_state(ckpt):
            return super()._restore_weights(ckpt, state)
        # a checkpoint of one plain process: rank 0 reads it, every rank takes its shards
        optimizer_state = state["trainer"].pop("optimizer")
        if self.world.is_main:
            from meshrl.model import load_model

            if self.lora:
                self.lora.load_adapter(ckpt / "adapter")
            else:
                self.host_model.load_state_dict(load_model(ckpt / "model").state_dict())
        self._broadcast_host(optimizer_state)

    def _broadcast_host(self, optimizer_state: dict[str, Any] | None) -> None:
        """Rank 0's `host_model` (and a plain AdamW state of it) into every rank's shards."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # separate calls: the combined set_state_dict skips the model on ranks given {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        full = self.host_model.state_dict() if self.world.is_main else {}
        set_model_state_dict(self.model, full, options=options)
        if optimizer_state is None:
            return
        optim_sd: dict[str, Any] = {}
        if self.world.is_main:
            plain = torch.optim.AdamW(  # positions as the trainer's: trainable ones only
                [p for p in self.host_model.parameters() if p.requires_grad])
            plain.load_state_dict(optimizer_state)  # keyed by position; FQN-keyed below
            optim_sd = get_optimizer_state_dict(self.host_model, plain)
        set_optimizer_state_dict(self.model, self.trainer.optimizer, optim_sd, options=options)

    def _start_rollouts(
        self, carried: list[RolloutBatch], weights: Weights
    ) -> tuple[RankSource, RankPublisher]:
        """Rank 0's source and publisher of one process, started with the gathered full
        weights, behind the wrappers every rank uses."""
        full = gather_full(self.world, weights)
        source = publisher = None
        if self.world.is_main:
            source, publisher = super()._start_rollouts(carried, self.set_latest(full))
        return RankSource(self.world, source), RankPublisher(self.world, publisher,
                                                              self.set_latest)

    def checkpoint(self, source: RolloutSource) -> Path:
        from meshrl.model import save_model
        from meshrl.rl.dcp_checkpoint import save_distributed_checkpoint, write_trainer_state

        def write_main(directory: Path) -> None:
            state = self.checkpoint_state(source)
            state["trainer"] = {"scheduler": self.trainer.scheduler.state_dict()}
            self._sync_host()
            if self.lora:  # model/: the effective weights; adapter/: peft's layout
                self.lora.save_effective(directory / "model")
                self.lora.save_adapter(directory / "adapter")
            else:
                save_model(self.host_model, self.tokenizer, directory / "model")
            write_trainer_state(directory, state, self.step)

        return save_distributed_checkpoint(
            self.dir / "checkpoints", self.step, self.world, self.model, self.trainer.optimizer,
            write_main, keep=self.cfg.run.keep_checkpoints,
        )

    def set_latest(self, weights: Weights) -> Weights:
        """Keep the newest gathered weights (rank 0); returns what the publisher sends: them,
        or with LoRA the effective weights they stand for."""
        self.latest_weights = weights
        self._latest_serial += 1
        if not self.lora:
            return weights
        self._sync_host()
        return self.lora.effective_state()

    def _sync_host(self) -> None:
        """Load the newest published weights into rank 0's plain copy (once per version)."""
        if self.latest_weights is not None and self._host_serial != self._latest_serial:
            self.host_model.load_state_dict(self.latest_weights)
            self._host_serial = self._latest_serial
