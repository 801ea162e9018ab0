"""LoRA RL: a frozen base and trained low-rank adapters (peft), and the weights they stand for.

The warm-started policy is saved once as the run's base (`<run>/base`, an HF model directory)
and frozen; `peft` injects adapters (A: Kaiming-random, B: zero, so step 0 computes exactly the
base) into `target_modules`, and only they are trained. The trainer's forward is peft's
unmerged `W x + scale * B (A x)`; everything that leaves the trainer is the *effective* weights,
merged by the one bit-exact rule of `shardcast/adapter.py`: the local generator's weights, a
full or delta broadcast, the checkpoint's `model/` (so `meshrl eval` reads a LoRA checkpoint
like any other), and the `effective_sha256` an adapter version states. Version `base_version`
(the first a run publishes) is the base itself.

A checkpoint holds `model/` (effective weights) and `adapter/` (peft's layout, what a resumed
run loads onto `<run>/base`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from meshrl.rl.config import LoraConfig
from meshrl.shardcast.adapter import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterSpec,
    merge_weights,
    read_adapter,
    read_weights,
    weights_sha256,
    write_effective,
)

__all__ = ["LoraPolicy"]


class LoraPolicy:
    """The adapters of `model` (a plain HF causal LM holding the base weights saved at
    `base_dir`), trained in place: `self.model` is the same module with adapters injected."""

    def __init__(self, model: Any, base_dir: Path, cfg: LoraConfig, seed: int = 0) -> None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        self.base_dir, self.cfg = Path(base_dir), cfg
        self.base_files = read_weights(self.base_dir)  # {file: {name: float32 array}}, frozen
        self.tied = bool(getattr(model.config, "tie_word_embeddings", False))
        peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, use_rslora=cfg.rslora,
                                  target_modules=list(cfg.target_modules), lora_dropout=0.0,
                                  bias="none")
        with torch.random.fork_rng(devices=[]):  # A's init: a function of the run's seed
            torch.manual_seed(seed)
            self.peft = get_peft_model(model, peft_cfg)
        self.model = self.peft.get_base_model()  # the HF module, adapters in its Linear layers
        self.spec = AdapterSpec(cfg.rank, cfg.alpha, cfg.rslora)

    # ---- the adapter -------------------------------------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        """peft's adapter state dict (base_model.model.<module>.lora_{A,B}.weight), float32."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().float().contiguous().cpu()
                for k, v in get_peft_model_state_dict(self.peft).items()}

    def save_adapter(self, directory: Path) -> None:
        """The adapter in peft's layout (config + safetensors), loadable by `peft` itself."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file(self.adapter_state(), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = self.peft.peft_config["default"].to_dict()
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, sort_keys=True, default=str))

    def load_adapter(self, directory: Path) -> None:
        """Adapter weights of a checkpoint's `adapter/` (checked like any received adapter)."""
        spec, pairs = read_adapter(directory)
        if spec != self.spec:
            raise ValueError(f"{directory}: adapter of rank {spec.rank}, alpha {spec.alpha}; "
                             f"this run trains rank {self.spec.rank}, alpha {self.spec.alpha}")
        state = {}
        for name, (a, b) in pairs.items():
            module = name.removesuffix(".weight")
            state[f"base_model.model.{module}.lora_A.weight"] = torch.from_numpy(a.copy())
            state[f"base_model.model.{module}.lora_B.weight"] = torch.from_numpy(b.copy())
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft, state)
        if result.unexpected_keys:
            raise ValueError(f"{directory}: adapter for modules this model lacks: "
                             f"{result.unexpected_keys[:3]}")

    # ---- the weights it stands for ---------------------------------------------------------
    def effective_files(self) -> dict[str, dict[str, np.ndarray]]:
        """The base's safetensors files with every target weight merged (adapter.py's rule)."""
        state = self.adapter_state()
        pairs = {}
        for key, value in state.items():
            if key.endswith(".lora_A.weight"):
                module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = state[key.replace(".lora_A.weight", ".lora_B.weight")]
                pairs[module + ".weight"] = (value.numpy(), b.numpy())
        out = {}
        for name, tensors in self.base_files.items():
            out[name] = {**tensors, **merge_weights(tensors, self.spec, pairs)}
        return out

    def effective_sha256(self) -> str:
        return weights_sha256({k: v for f in self.effective_files().values() for k, v in f.items()})

    def effective_state(self) -> dict[str, torch.Tensor]:
        """The effective weights as a plain model's state dict (what a generator loads)."""
        state = {k: torch.from_numpy(v) for f in self.effective_files().values()
                 for k, v in f.items()}
        embed = state.get("model.embed_tokens.weight")
        if self.tied and "lm_head.weight" not in state and embed is not None:
            state["lm_head.weight"] = embed
        return state

    def save_effective(self, directory: Path) -> str:
        """A plain model directory of the effective weights (the base's files, merged); returns
        their sha256."""
        from safetensors.numpy import save_file

        directory.mkdir(parents=True, exist_ok=True)
        files = self.effective_files()
        for p in self.base_dir.iterdir():
            if p.is_file() and p.suffix != ".safetensors":
                shutil.copyfile(p, directory / p.name)
        for name, tensors in files.items():
            save_file(tensors, str(directory / name), metadata={"format": "pt"})
        return weights_sha256({k: v for f in files.values() for k, v in f.items()})

    def save_version(self, directory: Path) -> str:
        """An adapter version's three files (shardcast/adapter.py); returns the effective sha256
        they state."""
        self.save_adapter(directory)
        digest = self.effective_sha256()
        write_effective(directory, digest)
        return digest

    def plain_model(self) -> Any:
        """A fresh plain HF module with the effective weights (for a generator's own copy)."""
        from meshrl.model import load_model

        model = load_model(self.base_dir)
        model.load_state_dict(self.effective_state(), strict=False)
        return model
