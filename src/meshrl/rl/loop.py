"""`meshrl train`: supervised warm-start, then asynchronous GRPO-family RL.

The loop in `RLRun.run` is the algorithm: take the batch for this step (generated concurrently by
a policy at most `async_level` versions old), compute group-relative advantages, drop groups with
no signal, take one optimizer step, publish the new policy to the generator, log, evaluate,
checkpoint.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from meshrl.config import CommandError
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
from meshrl.rl.sft import warm_start
from meshrl.rl.trainer import Trainer

__all__ = ["RLRun", "train"]


def train(cfg: RLConfig) -> dict[str, Any]:
    """Run (or resume) the training job described by `cfg`; returns the final summary."""
    return RLRun(cfg).run()


class RLRun:
    """One training run: its model, trainer, rollout pipeline, metrics and checkpoints."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.run.dir) / cfg.run.name
        self.async_threads = max(1, cfg.run.threads // 2)
        default = self.async_threads if cfg.async_level > 0 else cfg.run.threads
        torch.set_num_threads(cfg.run.trainer_threads or default)
        self.tokenizer, self.model = self._build_policy()
        self.tasks = cfg.tasks.build()  # once per run: a math task reads its file here
        self.heldout = heldout_problems(self.tasks, cfg.eval)
        self.exclude = frozenset(p.prompt for p in self.heldout)
        self.eval_backend = ReferenceBackend(self.model, self.tokenizer)  # the live policy
        self.metrics = MetricsWriter(
            self.dir / "metrics.jsonl", cfg.run.wandb_project, cfg.run.name, cfg.model_dump()
        )
        self.pack_cost = PackCost.for_model(self.model)
        self.trainer = Trainer(self.model, cfg.trainer, cfg.loss, cfg.rollout.temperature,
                               total_steps=cfg.steps)
        self.step = 0
        self.elapsed_before = 0.0  # wall time of earlier sessions of this run
        self.t0 = time.perf_counter()
        self.accuracy = float("nan")

    # ----------------------------------------------------------------------------- the algorithm
    def run(self) -> dict[str, Any]:
        carried = self._resume_or_warm_start()
        pipeline = self._start_pipeline(carried)
        bar = self._progress_bar()
        try:
            while self.step < self.cfg.steps and not self._reached_target():
                t_step = time.perf_counter()
                batch = pipeline.get(self.step)
                wait = time.perf_counter() - t_step
                t_train = time.perf_counter()
                advantages, keep = self.advantages(batch)
                stats = self.train_on(batch, advantages, keep)
                stats["train_seconds"] = time.perf_counter() - t_train
                self.step += 1
                pipeline.publish(self.step, self.model.state_dict())
                self._log_step(batch, stats, keep, wait, time.perf_counter() - t_step, pipeline)
                if self.step % self.cfg.eval.every == 0 or self.step == self.cfg.steps:
                    self.evaluate("rl")
                if self.step % self.cfg.run.checkpoint_every == 0:
                    self.checkpoint(pipeline)
                bar.update(1)
                bar.set_postfix(reward=f"{stats['reward']:.2f}", acc=f"{self.accuracy:.2f}")
            self.checkpoint(pipeline)
        finally:
            pipeline.close()
            bar.close()
        return self._finish()

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
        g = batch.rewards.shape[1]
        rows = [i for i in range(len(batch.prompt_ids)) if bool(keep[i // g])]
        stats = {"reward": float(batch.rewards.mean()),
                 "accuracy": float(batch.task_rewards.mean())}
        if not rows:
            return stats
        tensors = pack_groups(
            [batch.prompt_ids[i] for i in rows],
            [batch.completion_ids[i] for i in rows],
            [batch.inference_logprobs[i] for i in rows],
            self.tokenizer.pad_token_id,
            cost=self.pack_cost,
        )
        return {**stats, **self.trainer.train_step(tensors, advantages.reshape(-1)[rows])}

    def evaluate(self, phase: str, step: int | None = None) -> float:
        result = evaluate(self.eval_backend, self.tokenizer, self.heldout, self.tasks,
                          self.cfg.eval)
        self.accuracy = result["accuracy"]
        step = self.step if step is None else step
        self.metrics.log({"kind": "eval", "phase": phase, "step": step,
                          "elapsed": self.elapsed(), **result})
        return self.accuracy

    def checkpoint(self, pipeline: RolloutPipeline) -> Path:
        in_flight = pipeline.pending(self.step + self.cfg.async_level - 1)
        state = {
            "trainer": self.trainer.state_dict(),
            "rng": rng_state(),
            "elapsed": self.elapsed(),
            "accuracy": self.accuracy,
            "in_flight": [b.to_dict() for b in in_flight],
        }
        return save_checkpoint(self.dir / "checkpoints", self.step, self.model, self.tokenizer,
                               state, keep=self.cfg.run.keep_checkpoints)

    # ------------------------------------------------------------------------------- plumbing
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0

    def _build_policy(self) -> tuple[Any, Any]:
        from meshrl.model import CharTokenizer, build_model, load_model, load_tokenizer

        if self.cfg.model.path:
            return load_tokenizer(self.cfg.model.path), load_model(self.cfg.model.path)
        tok = CharTokenizer()
        return tok, build_model(self.cfg.model.preset, tok.vocab_size, seed=self.cfg.run.seed)

    def _resume_or_warm_start(self) -> list[RolloutBatch]:
        ckpt = latest_checkpoint(self.dir / "checkpoints") if self.cfg.run.resume else None
        if ckpt is None:
            def on_eval(step: int, accuracy: float, loss: float) -> None:
                self.metrics.log({"kind": "sft", "step": step, "loss": loss,
                                  "accuracy": accuracy, "elapsed": self.elapsed()})

            result = warm_start(self.model, self.tokenizer, self.cfg.sft, self.tasks,
                                lambda step: self.evaluate("sft", step), self.cfg.run.seed,
                                self.exclude, on_eval=on_eval)
            self.metrics.log({"kind": "warm_start", **result, "elapsed": self.elapsed()})
            self._keep_reference(fresh=True)
            self.evaluate("rl")
            return []
        from meshrl.model import load_model

        self._keep_reference(fresh=False)
        self.model.load_state_dict(load_model(ckpt / "model").state_dict())
        state = load_trainer_state(ckpt)
        self.trainer.load_state_dict(state["trainer"])
        set_rng_state(state["rng"])
        self.step, self.elapsed_before = int(state["step"]), float(state["elapsed"])
        self.accuracy = float(state["accuracy"])
        self.metrics.log({"kind": "resume", "step": self.step, "checkpoint": str(ckpt)})
        return [RolloutBatch.from_dict(b) for b in state["in_flight"]]

    def _keep_reference(self, fresh: bool) -> None:
        """The KL term's frozen reference: the warm-started policy, kept in `<run>/reference`
        so a resumed run measures KL to the same policy."""
        if not self.cfg.loss.kl_coef:
            return
        from meshrl.model import load_model, save_model

        path = self.dir / "reference"
        if fresh:
            save_model(self.model, self.tokenizer, path)
        elif not (path / "config.json").is_file():
            raise CommandError(f"{path}: no reference policy to resume loss.kl_coef > 0 with (the"
                               " run started with kl_coef = 0; start a new run to use the KL term)")
        self.trainer.reference = load_model(path).requires_grad_(False)

    def _start_pipeline(self, carried: list[RolloutBatch]) -> RolloutPipeline:
        cfg = self.cfg
        if cfg.rollout.subprocess:
            from meshrl.rl.subprocess_backend import SubprocessBackend

            backend = SubprocessBackend(cfg.rollout.backend, copy.deepcopy(self.model),
                                        self.tokenizer, self.async_threads)
        else:
            backend = build_backend(cfg.rollout.backend, copy.deepcopy(self.model),
                                    self.tokenizer)

        def make_batch(gen: Any, index: int, version: int) -> RolloutBatch:
            return generate_batch(gen, self.tokenizer, cfg.rollout, self.tasks, cfg.run.seed,
                                  index, version, self.exclude)

        pipeline = RolloutPipeline(backend, make_batch, cfg.async_level, self.step, carried,
                                   num_threads=self.async_threads)
        return pipeline.start(self.model.state_dict())

    def _reached_target(self) -> bool:
        target = self.cfg.stop_at_accuracy
        return target is not None and self.accuracy >= target

    def _log_step(self, batch: RolloutBatch, stats: dict[str, float], keep: torch.Tensor,
                  wait: float, seconds: float, pipeline: RolloutPipeline) -> None:
        self.metrics.log({
            "kind": "step", "step": self.step, "version": batch.version,
            "staleness": self.step - 1 - batch.version, **stats,
            "kept_groups": int(keep.sum()), "groups": int(keep.numel()),
            "truncated": batch.truncated, "tokens": batch.num_tokens,
            "completion_tokens": batch.num_completion_tokens,
            "tokens_per_s": batch.num_tokens / max(seconds, 1e-9),
            "step_seconds": seconds, "wait_seconds": wait, "gen_seconds": batch.gen_seconds,
            "dropped_stale": pipeline.dropped_stale, "elapsed": self.elapsed(),
        })

    def _progress_bar(self) -> Any:
        from tqdm import tqdm

        return tqdm(total=self.cfg.steps, initial=self.step, disable=not self.cfg.run.progress,
                    desc="rl", dynamic_ncols=True)

    def _finish(self) -> dict[str, Any]:
        self.metrics.close()
        png = None
        if self.cfg.run.plot:
            png = plot_curves(self.dir / "metrics.jsonl", self.dir / "curves.png")
        return {"steps": self.step, "accuracy": self.accuracy, "elapsed": self.elapsed(),
                "run_dir": str(self.dir), "plot": str(png) if png else None}
