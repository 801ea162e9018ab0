"""Cheat modes: realistic dishonest workers, so tests can show the validator catches each one.

Each cheat is what a worker that wants rewards without the work (or with easier work) would do:
- `other-model`: generates with another model of the same shape (its own, cheaper to obtain);
- `int8`: int8-quantized weights (cheaper inference), `scale-layer`: one layer's MLP output
  scaled by `scale` (a subtly different model);
- `cherry-pick`: answers easier problems (shortest answers drawn from other counters) in place
  of the assigned ones, still claiming the assigned counter;
- `forge-rewards`: claims reward 1 for every wrong answer;
- `forge-sampling`: samples at another temperature (0: greedy) while claiming the pool's;
- `truncate`: ends completions early with an EOS the sampler did not choose (fewer tokens);
- `stale-policy`: keeps generating with the policy it had when the cheat began;
- `copy`: submits another worker's file as its own;
- `inflate-units`: claims twice the work units it did.
A cheat is active on steps > `after_step`, so a test can watch an honest node turn.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from meshrl.inference import Completion, SamplingParams
from meshrl.pool import Assignment
from meshrl.tasks import Problem, TaskSet
from meshrl.wire.rollout_file import RolloutFile
from meshrl.worker.config import CheatConfig
from meshrl.worker.rollouts import sampling_params

__all__ = ["Cheat"]

WEIGHT_CHEATS = ("other-model", "int8", "scale-layer")


class Cheat:
    """Hooks a worker calls at each stage; every one is the identity when the cheat is off."""

    def __init__(self, cfg: CheatConfig) -> None:
        self.cfg = cfg

    def active(self, step: int) -> bool:
        return self.cfg.mode != "none" and step > self.cfg.after_step

    def on(self, mode: str, step: int) -> bool:
        return self.cfg.mode == mode and self.active(step)

    # ---- weights ---------------------------------------------------------------------------
    def weights(self, state: dict[str, torch.Tensor], model_config: Any,
                step: int) -> dict[str, torch.Tensor]:
        """The weights this worker really loads for `step`."""
        if not self.active(step) or self.cfg.mode not in WEIGHT_CHEATS:
            return state
        if self.cfg.mode == "other-model":
            return _other_model(model_config, self.cfg.other_seed)
        out = dict(state)
        if self.cfg.mode == "int8":
            from meshrl.toploc.perturb import quantize_tensor

            for name, w in state.items():
                if ".layers." in name and name.endswith("proj.weight"):
                    out[name] = quantize_tensor(w, 8)
            return out
        layers = sorted({int(n.split(".layers.")[1].split(".")[0]) for n in state
                         if ".layers." in n})
        name = f"model.layers.{layers[len(layers) // 2]}.mlp.down_proj.weight"
        out[name] = (state[name].float() * self.cfg.scale).to(state[name].dtype)
        return out

    # ---- generation ------------------------------------------------------------------------
    def problems(self, a: Assignment, tasks: TaskSet) -> list[Problem] | None:
        """cherry-pick: the easiest of several counters' problems instead of the assigned ones."""
        if not self.on("cherry-pick", a.step):
            return None
        pool = [p for c in range(1, 9)
                for p in replace(a, counter=a.counter + 1000 * c).problems(tasks)]
        pool.sort(key=lambda p: (len(p.answer), p.prompt))
        return pool[: a.rules.prompts_per_file]

    def sampling(self, a: Assignment) -> SamplingParams | None:
        if not self.on("forge-sampling", a.step):
            return None
        return sampling_params(a).model_copy(update={"temperature": self.cfg.temperature})

    def edit(self, step: int, eos_token_id: int) -> Any:
        """truncate: cut every completion of 2+ tokens at half its length, ending on EOS."""
        if not self.on("truncate", step):
            return None

        def cut(comps: list[Completion]) -> list[Completion]:
            out = []
            for c in comps:
                k = len(c.token_ids) // 2
                if k < 1 or (c.finish_reason == "eos" and len(c.token_ids) <= 2):
                    out.append(c)
                    continue
                tokens = [*c.token_ids[: k - 1], eos_token_id]
                out.append(replace(c, token_ids=tokens, logprobs=c.logprobs[:k],
                                   finish_reason="eos", hidden_states=c.hidden_states[:k]))
            return out

        return cut

    def finish(self, rf: RolloutFile) -> RolloutFile:
        """Claims written into the file after generation."""
        if self.on("forge-rewards", rf.header.step):
            for r in rf.completions:
                r.reward = max(r.reward, 1.0)
        if self.on("inflate-units", rf.header.step):
            rf.header = rf.header.model_copy(update={"work_units": 2 * rf.header.work_units})
        return rf

    def frozen_version(self, step: int) -> bool:
        """stale-policy: stop loading new policy versions."""
        return self.on("stale-policy", step)


def _other_model(model_config: Any, seed: int) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(model_config)
    return model.state_dict()
