"""`RolloutGenerator` over meshrl's inference engine (`meshrl.inference.CPUEngine`)."""

from __future__ import annotations

from typing import Any

import torch

from meshrl.rl.generation import Generated, GenParams

__all__ = ["EngineGenerator"]


class EngineGenerator:
    """Rollouts from the CPU engine: same replayable sampler, so same tokens as TorchGenerator."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 1024) -> None:
        from meshrl.inference import CPUEngine, EngineConfig

        self.engine = CPUEngine(model, tokenizer, EngineConfig(max_batch_size=max_batch_size))

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.engine.load_weights(state_dict)

    def generate(
        self, prompts: list[list[int]], params: GenParams, seq_ids: list[int]
    ) -> list[Generated]:
        from meshrl.inference import SamplingParams

        sampling = SamplingParams(
            max_new_tokens=params.max_new_tokens, temperature=params.temperature,
            top_p=params.top_p, seed=params.seed,
        )
        outs = self.engine.generate(prompts, sampling, seq_ids=seq_ids)
        return [
            Generated(list(o.token_ids), list(o.logprobs),
                      "length" if o.finish_reason == "length" else "eos")
            for o in outs
        ]
