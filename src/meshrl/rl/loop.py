# over 400 lines: `meshrl train`'s run: the warm start, the RL loop and their stops, which share the
#  run's state
"""`meshrl train`: supervised warm-start, then asynchronous GRPO-family RL.

The loop in `RLRun.run` is the algorithm: take the batch for this step (generated concurrently by
a policy at most `async_level` versions old), compute group-relative advantages, drop groups with
no signal, take one optimizer step, publish the new policy to the generator, log, evaluate,
checkpoint. Where batches come from and where each policy goes are the two interfaces of
source.py: the local pipeline (pipeline.py), a pool's ledger and shardcast origin
(network_source.py), or either behind rank 0 under torchrun (dist_run.py).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from meshrl.config import CommandError, Interrupted
from meshrl.inference import ReferenceBackend, build_backend
from meshrl.rl.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from meshrl.rl.config import RLConfig
from meshrl.rl.evaluate import evaluate, heldout_problems
from meshrl.rl.metrics import MetricsWriter, plot_curves
from meshrl.rl.packing import PackCost, pack_groups
from meshrl.rl.pipeline import RolloutPipeline
from meshrl.rl.rollouts import RolloutBatch, generate_batch
from meshrl.rl.sft import saved_progress, warm_start
from meshrl.rl.source import PolicyPublisher, RolloutSource, Weights
from meshrl.rl.trainer import Trainer

__all__ = ["RLRun", "group_rows", "train"]


def train(cfg: RLConfig) -> dict[str, Any]:
    """Run (or resume) the training job described by `cfg`; returns the final summary.
    One process; under torchrun `meshrl train` calls `dist_run.train_distributed` on every rank."""
    import os

    from meshrl.rl.distributed import launched_by_torchrun

    if launched_by_torchrun(os.environ):
        raise RuntimeError("this process was started by torchrun: call "
                           "meshrl.rl.dist_run.train_distributed (as `meshrl train` does)")
    return RLRun(cfg).run()


class RLRun:
    """One training run: its model, trainer, rollout source, policy publisher, metrics and
    checkpoints."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.run.dir) / cfg.run.name
        self.async_threads = max(1, cfg.run.threads // 2)
        local_gen = cfg.async_level > 0 and not (cfg.network.orchestrator_url
                                                 or cfg.rollout.lockstep)
        default = self.async_threads if local_gen else cfg.run.threads
        torch.set_num_threads(cfg.run.trainer_threads or default)
        # once per run (a dataset task reads its file here), and first: bad task input is
        # refused before seconds go into building the model
        self.tasks = cfg.tasks.build()
        self.tokenizer, self.model = self._build_policy()
        # the whole policy as one plain module, evaluated, saved and copied to the generator:
        # the trained model itself in one process, a copy on rank 0 under FSDP
        self.host_model = self._host_model()
        self.heldout = heldout_problems(self.tasks, cfg.eval)
        self.exclude = frozenset(p.prompt for p in self.heldout)
        self.eval_backend = ReferenceBackend(self.host_model, self.tokenizer)  # the live policy
        self.metrics = MetricsWriter(
            self.dir / "metrics.jsonl", cfg.run.wandb_project, cfg.run.name, cfg.model_dump(),
            enabled=self._is_main(),
        )
        self.pack_cost = PackCost.for_model(self.model)
        self.trainer = self._build_trainer()
        self.lora: Any = None  # LoraPolicy once attached (lora.enabled: after the warm start)
        self.step = 0
        self.elapsed_before = 0.0  # wall time of earlier sessions of this run
        self.t0 = time.perf_counter()
        self.accuracy = float("nan")
        self.waited = self.stepped = 0.0  # this session's seconds waiting for batches, in steps
        self.phase = "the start"  # where a Ctrl-C finds the run, for its one line

    # ----------------------------------------------------------------------------- the algorithm
    def run(self) -> dict[str, Any]:
        try:
            carried = self._resume_or_warm_start()
            self.phase = "the start of RL"
            source, publisher = self._start_rollouts(carried, self.policy_weights())
        except KeyboardInterrupt:
            raise Interrupted(self._stopped_in(self.phase)) from None
        bar = self._progress_bar()
        try:
            while self.step < self.cfg.steps and not self._reached_target():
                t_step = time.perf_counter()
                batch = source.get(self.step)
                wait = time.perf_counter() - t_step
                t_train = time.perf_counter()
                advantages, keep = self.advantages(batch)
                stats = self.train_on(batch, advantages, keep)
                stats["train_seconds"] = time.perf_counter() - t_train
                self.step += 1
                publisher.publish(self.step, self.policy_weights())
                self._log_step(batch, stats, keep, wait, time.perf_counter() - t_step, source)
                if self.step % self.cfg.eval.every == 0 or self.step == self.cfg.steps:
                    self.evaluate("rl")
                if self.step % self.cfg.run.checkpoint_every == 0:
                    self.checkpoint(source)
                bar.update(1)
                bar.set_postfix(reward=f"{stats['reward']:.2f}", acc=f"{self.accuracy:.2f}")
            self.checkpoint(source)
        except KeyboardInterrupt:  # `finally` stops the generator first (no child traceback)
            raise Interrupted(self._stopped_in(f"RL step {self.step + 1}")) from None
        finally:
            source.close()
            bar.close()
        return self._finish()

    def _stopped_in(self, phase: str) -> str:
        """The one line of a run stopped by Ctrl-C: where, what was kept, what the next start
        does. A stopped warm start saves its progress (rl/sft.py), resumed by the next run."""
        ckpt = latest_checkpoint(self.dir / "checkpoints")
        warm = saved_progress(self.warm_dir)
        head = f"interrupted during {phase}"
        if phase == "the warm start" and warm is not None and not warm["done"]:
            head += f": its progress is saved at step {warm['step']} in {self.warm_dir}"
        if ckpt:
            tail = f"`meshrl train` with the same config resumes from {ckpt}"
        elif warm is not None:
            tail = ("`meshrl train` with the same config resumes the warm start from step "
                    f"{warm['step'] + 1}" if not warm["done"] else
                    "`meshrl train` with the same config starts RL from the saved warm start")
        else:
            tail = "`meshrl train` with the same config starts the run over"
        return f"{head}; {tail}"

    @property
    def warm_dir(self) -> Path:
        return self.dir / "warm_start"

    def advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Group-relative advantages [groups, group_size] and the groups that carry signal."""
        from meshrl.rl.advantages import group_advantages, nonzero_groups

        adv = group_advantages(batch.rewards, normalize_std=self.cfg.loss.normalize_advantage_std)
        if not self.cfg.filter_groups:
            return adv, torch.ones(adv.shape[0], dtype=torch.bool)
        return adv, nonzero_groups(adv)

    def train_on(
        self, batch: RolloutBatch, advantages: torch.Tensor, keep: torch.Tensor
    ) -> dict[str, float]:
        """One optimizer step on the completions of the kept groups (none kept: no update)."""
        groups = keep.nonzero().flatten().tolist()
        stats = {"reward": float(batch.rewards.mean()),
                 "accuracy": float(batch.task_rewards.mean())}
        if not groups:
            return stats
        return {**stats, **self.train_groups(batch, advantages, groups)}

    def train_groups(
        self, batch: RolloutBatch, advantages: torch.Tensor, groups: list[int]
    ) -> dict[str, float]:
        rows = group_rows(groups, batch.rewards.shape[1])
        return self.trainer.train_step(self.pack(batch, rows), advantages.reshape(-1)[rows])

    def pack(self, batch: RolloutBatch, rows: list[int]) -> dict[str, torch.Tensor]:
        """The completions `rows` of `batch` in the shared-prompt layout of packing.py."""
        return pack_groups(
            [batch.prompt_ids[i] for i in rows],
            [batch.completion_ids[i] for i in rows],
            [batch.inference_logprobs[i] for i in rows],
            self.tokenizer.pad_token_id,
            cost=self.pack_cost,
            loss_masks=None if batch.loss_masks is None else [batch.loss_masks[i] for i in rows],
        )

    def evaluate(self, phase: str, step: int | None = None) -> float:
        # The warm start stops on greedy accuracy; pass@k (k samples a problem) is for RL.
        cfg = self.cfg.eval.model_copy(update={"pass_k": []}) if phase == "sft" else self.cfg.eval
        result = evaluate(self.eval_backend, self.tokenizer, self.heldout, self.tasks,
                          cfg, self.cfg.rollout.prompt_format)
        self.accuracy = result["accuracy"]
        step = self.step if step is None else step
        self.metrics.log({"kind": "eval", "phase": phase, "step": step,
                          "elapsed": self.elapsed(), **result})
        return self.accuracy

    def policy_weights(self) -> Weights:
        """The weights the policy computes with, as a plain model's state dict (LoRA: merged
        by the published rule, rl/lora.py); with network.publish_dtype = "bfloat16" the
        float32 master weights rounded to bfloat16 and upcast (exact), the values a worker
        loads from the published checkpoint, so this process's own rollouts match theirs."""
        state = self.lora.effective_state() if self.lora else self.model.state_dict()
        if self.cfg.network.publish_dtype == "float32":
            return state
        return {k: v.detach().to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v
                for k, v in state.items()}

    def checkpoint(self, source: RolloutSource) -> Path:
        state = self.checkpoint_state(source)
        save_weights = None
        if self.lora:  # model/: the effective weights (any reader); adapter/: for resume
            def save_weights(directory: Path) -> None:
                self.lora.save_effective(directory / "model")  # the base's tokenizer too
                self.lora.save_adapter(directory / "adapter")
        return save_checkpoint(self.dir / "checkpoints", self.step, self.model, self.tokenizer,
                               state, keep=self.cfg.run.keep_checkpoints,
                               save_weights=save_weights)

    def checkpoint_state(self, source: RolloutSource) -> dict[str, Any]:
        """Everything of a checkpoint but the weights (and, sharded, the optimizer)."""
        in_flight = source.pending(self.step + self.cfg.async_level - 1)
        return {
            "trainer": self.trainer.state_dict(),
            "rng": rng_state(),
            "elapsed": self.elapsed(),
            "accuracy": self.accuracy,
            "in_flight": [b.to_dict() for b in in_flight],
        }

    # ------------------------------------------------------------------------------- plumbing
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0

    def _is_main(self) -> bool:
        """Does this process write metrics, evaluate and publish? (the only one: yes)"""
        return True

    def _host_model(self) -> Any:
        return self.model

    def _build_trainer(self) -> Trainer:
        return Trainer(self.model, self.cfg.trainer, self.cfg.loss, self.cfg.rollout.temperature,
                       total_steps=self.cfg.steps)

    def _build_policy(self) -> tuple[Any, Any]:
        from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer

        path = self.cfg.model.path
        if self.cfg.model.source:  # a GGUF: imported on first use, then the cached directory
            from meshrl.model.gguf_import import resolve_model_source

            path = str(resolve_model_source(self.cfg.model.source, self.cfg.model.cache))
        if path:  # the model first: its family check names a directory meshrl cannot use
            model = load_model(path)
            return load_tokenizer(path), model
        tok = CharTokenizer()
        return tok, build_model(self.cfg.model.preset, tok.vocab_size, seed=self.cfg.run.seed)

    def _resume_or_warm_start(self) -> list[RolloutBatch]:
        ckpt = latest_checkpoint(self.dir / "checkpoints") if self.cfg.run.resume else None
        if ckpt is None:
            self.phase = "the warm start"
            self._warm_start()
            return []
        self.phase = f"resuming from {ckpt}"
        return self._resume(ckpt)

    def _warm_start(self) -> None:
        """Supervised warm-start of `host_model`, then the first held-out evaluation."""
        def on_eval(step: int, accuracy: float, loss: float) -> None:
            # with its budget and the accuracy that ends it, for the dashboard's phase line
            self.metrics.log({"kind": "sft", "step": step, "loss": loss,
                              "accuracy": accuracy, "elapsed": self.elapsed(),
                              "max_steps": self.cfg.sft.max_steps,
                              "target": self.cfg.sft.target_accuracy})

        saved = saved_progress(self.warm_dir) if self.cfg.run.resume else None
        if saved is not None:  # a stopped (or finished) warm start of this run continues
            self.metrics.log({"kind": "warm_start_resume", **saved, "path": str(self.warm_dir)})
        result = warm_start(self.host_model, self.tokenizer, self.cfg.sft, self.tasks,
                            lambda step: self.evaluate("sft", step), self.cfg.run.seed,
                            self.exclude, on_eval=on_eval,
                            prompt_format=self.cfg.rollout.prompt_format,
                            progress=self.warm_dir if self._is_main() else None,
                            resume=self.cfg.run.resume)
        self.metrics.log({"kind": "warm_start", **result, "elapsed": self.elapsed()})
        self._keep_reference(fresh=True)
        self._attach_lora(fresh=True)
        self.evaluate("rl")

    def _resume(self, ckpt: Path) -> list[RolloutBatch]:
        """Restore weights, optimizer, schedule, RNG, clocks and the batches in flight."""
        self._keep_reference(fresh=False)
        self._attach_lora(fresh=False)
        state = load_trainer_state(ckpt)
        self._restore_weights(ckpt, state)
        self.trainer.load_state_dict(state["trainer"])
        set_rng_state(state["rng"])
        self.step, self.elapsed_before = int(state["step"]), float(state["elapsed"])
        self.accuracy = float(state["accuracy"])
        self.metrics.log({"kind": "resume", "step": self.step, "checkpoint": str(ckpt)})
        return [RolloutBatch.from_dict(b) for b in state["in_flight"]]

    def _restore_weights(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Policy weights (and, from a sharded checkpoint, the optimizer) of `ckpt`."""
        from meshrl.model import load_model
        from meshrl.rl.dcp_checkpoint import has_sharded_state, load_sharded_state

        if has_sharded_state(ckpt):  # written under torchrun: any world size resumes it
            load_sharded_state(ckpt, self.model, self.trainer.optimizer)
        elif self.lora:
            self.lora.load_adapter(ckpt / "adapter")
        else:
            self.model.load_state_dict(load_model(ckpt / "model").state_dict())

    def _attach_lora(self, fresh: bool) -> None:
        """lora.enabled: the policy as it is now becomes the frozen base (`<run>/base`, saved
        once; a resumed run loads it back) and only adapters are trained from here on."""
        if not self.cfg.lora.enabled:
            return
        from meshrl.model import load_model, save_model
        from meshrl.rl.lora import LoraPolicy

        base = self.dir / "base"
        if fresh:
            save_model(self.host_model, self.tokenizer, base)
        elif not (base / "config.json").is_file():
            raise CommandError(f"{base}: no LoRA base to resume lora.enabled with (the run "
                               "started without LoRA; start a new run to train adapters)")
        else:
            self.model.load_state_dict(load_model(base).state_dict())
        for p in self.model.parameters():
            p.grad = None  # the warm start's: the base is frozen from here on
        self.lora = LoraPolicy(self.model, base, self.cfg.lora, self.cfg.run.seed)
        self.model = self.host_model = self.lora.model
        self.eval_backend = ReferenceBackend(self.model, self.tokenizer)
        self.trainer = self._build_trainer()  # the optimizer over the adapters alone

    def _keep_reference(self, fresh: bool) -> None:
        """The KL term's frozen reference: the warm-started policy, kept in `<run>/reference`
        so a resumed run measures KL to the same policy."""
        if not self.cfg.loss.kl_coef:
            return
        from meshrl.model import load_model, save_model

        path = self.dir / "reference"
        if fresh:
            save_model(self.host_model, self.tokenizer, path)
        elif not (path / "config.json").is_file():
            raise CommandError(f"{path}: no reference policy to resume loss.kl_coef > 0 with (the"
                               " run started with kl_coef = 0; start a new run to use the KL term)")
        self.trainer.reference = load_model(path).requires_grad_(False)

    def _start_rollouts(
        self, carried: list[RolloutBatch], weights: Weights
    ) -> tuple[RolloutSource, PolicyPublisher]:
        """The rollout source and the policy publisher, running, with the starting policy
        (version `self.step`, whose weights are `weights`) published."""
        cfg = self.cfg
        if cfg.network.orchestrator_url:  # on a pool: accepted files from the ledger
            from meshrl.rl.network_source import NetworkSource

            source = NetworkSource(cfg.network, cfg.rollout, cfg.async_level, self.step,
                                   self.dir, (self.model, self.tokenizer), self.exclude,
                                   cfg.tasks, lora=self.lora)
            publisher = source.publisher()
            publisher.publish(self.step, weights)
            return source, publisher
        pipeline = self._rollout_pipeline(carried).start(weights)
        return pipeline, pipeline

    def _rollout_pipeline(self, carried: list[RolloutBatch]) -> RolloutPipeline:
        """The local pipeline, not started: a generator with its own copy of the policy."""
        cfg = self.cfg
        # the generator's own plain copy of the policy (LoRA: the effective weights)
        own = self.lora.plain_model() if self.lora else copy.deepcopy(self.host_model)
        if cfg.rollout.subprocess:
            from meshrl.rl.subprocess_backend import SubprocessBackend

            backend = SubprocessBackend(cfg.rollout.backend, own, self.tokenizer,
                                        self.async_threads)
        else:
            backend = build_backend(cfg.rollout.backend, own, self.tokenizer)

        def make_batch(gen: Any, index: int, version: int) -> RolloutBatch:
            return generate_batch(gen, self.tokenizer, cfg.rollout, self.tasks, cfg.run.seed,
                                  index, version, self.exclude)

        return RolloutPipeline(backend, make_batch, cfg.async_level, self.step, carried,
                               num_threads=self.async_threads, lockstep=cfg.rollout.lockstep)

    def _reached_target(self) -> bool:
        target = self.cfg.stop_at_accuracy
        return target is not None and self.accuracy >= target

    def _log_step(self, batch: RolloutBatch, stats: dict[str, float], keep: torch.Tensor,
                  wait: float, seconds: float, source: RolloutSource) -> None:
        self.waited, self.stepped = self.waited + wait, self.stepped + seconds
        self.metrics.log({
            "kind": "step", "step": self.step, "version": batch.version,
            "staleness": self.step - 1 - batch.version, **stats,
            "kept_groups": int(keep.sum()), "groups": int(keep.numel()),
            "truncated": batch.truncated, "tokens": batch.num_tokens,
            "completion_tokens": batch.num_completion_tokens,
            "tokens_per_s": batch.num_tokens / max(seconds, 1e-9),
            "step_seconds": seconds, "wait_seconds": wait, "gen_seconds": batch.gen_seconds,
            "dropped_stale": source.dropped_stale, "elapsed": self.elapsed(),
            # the share of this session's step time spent waiting for batches
            "idle_share": self.waited / max(self.stepped, 1e-9), **source.flow(),
        })

    def _progress_bar(self) -> Any:
        from tqdm import tqdm

        return tqdm(total=self.cfg.steps, initial=self.step,
                    disable=not (self.cfg.run.progress and self._is_main()),
                    desc="rl", dynamic_ncols=True)

    def _finish(self) -> dict[str, Any]:
        self.metrics.close()
        png = None
        if self.cfg.run.plot and self._is_main():
            png = plot_curves(self.dir / "metrics.jsonl", self.dir / "curves.png")
        return {"steps": self.step, "accuracy": self.accuracy, "elapsed": self.elapsed(),
                "run_dir": str(self.dir), "plot": str(png) if png else None}


def group_rows(groups: list[int], group_size: int) -> list[int]:
    """Completion rows of the given groups (rows are grouped: group i holds rows i*g .. i*g+g-1)."""
    return [g * group_size + j for g in groups for j in range(group_size)]
