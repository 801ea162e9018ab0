"""`meshrl model ...`: create a model directory from a preset, or describe one."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshrl.config import Config

__all__ = ["ModelInitConfig", "register"]


class ModelInitConfig(Config):
    preset: str = Field("qwen2-tiny", description="model preset name")
    out: str = Field("runs/model", description="output directory (HF layout)")
    seed: int = Field(0, description="initialisation seed")


def _init(cfg: ModelInitConfig) -> int:
    import json

    from meshrl.config import CommandError
    from meshrl.model import PRESETS, CharTokenizer, build_model, save_model

    if cfg.preset not in PRESETS:
        raise CommandError(f"unknown model preset {cfg.preset!r}; known: {', '.join(PRESETS)}")
    tok = CharTokenizer()
    model = build_model(cfg.preset, tok.vocab_size, seed=cfg.seed)
    save_model(model, tok, cfg.out)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"preset": cfg.preset, "params": n, "out": cfg.out}))
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("model", help="create or inspect policy models")
    sub = group.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    add_config_command(sub, "init", ModelInitConfig, _init, "build a preset model and save it")
