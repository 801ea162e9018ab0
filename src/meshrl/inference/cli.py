"""`meshrl inference generate`: sample completions from a model directory, one JSON line each."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshrl.config import Config
from meshrl.inference.params import EngineConfig, SamplingParams

__all__ = ["GenerateConfig", "register"]


class GenerateConfig(Config):
    model: str = Field("runs/model", description="model directory (HF layout + tokenizer)")
    prompts: list[str] = Field(default_factory=list, description="prompt texts")
    prompts_file: str | None = Field(None, description="file with one prompt per line")
    n: int = Field(1, ge=1, description="completions per prompt")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    engine: EngineConfig = Field(default_factory=EngineConfig)


def _generate(cfg: GenerateConfig) -> int:
    import json
    from pathlib import Path

    from meshrl.config import InputError
    from meshrl.model.families import check_model_dir

    prompts = list(cfg.prompts)
    if cfg.prompts_file:
        prompts += [ln for ln in Path(cfg.prompts_file).read_text().splitlines() if ln]
    if not prompts:
        raise InputError("no prompts (use --prompts or --prompts_file)")
    check_model_dir(cfg.model)  # before torch is imported: a wrong path is refused in a second
    from meshrl.inference import InferenceError
    from meshrl.inference.engine import CPUEngine
    try:  # a model the engine cannot run, a prompt too long for it: the user's input
        engine = CPUEngine.from_pretrained(cfg.model, cfg.engine)
        tok = engine.tokenizer
        ids = [tok.encode(p) for p in prompts for _ in range(cfg.n)]
        # seq_id = prompt index * n + completion index, as validators recompute it
        completions = engine.generate(ids, cfg.sampling, seq_ids=list(range(len(ids))))
    except InferenceError as e:
        raise InputError(str(e)) from None
    for c in completions:
        print(json.dumps({
            "seq_id": c.seq_id, "prompt": prompts[c.seq_id // cfg.n],
            "completion": tok.decode(c.token_ids), "token_ids": c.token_ids,
            "finish_reason": c.finish_reason, "logprob": round(sum(c.logprobs), 4),
        }))
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("inference", help="generate rollouts with the inference engine")
    sub = group.add_subparsers(dest="inference_command", metavar="ACTION", required=True)
    add_config_command(sub, "generate", GenerateConfig, _generate,
                       "sample completions from a model directory (JSON lines)")
