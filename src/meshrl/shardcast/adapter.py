"""LoRA adapter versions: the few megabytes a client holding the pool's base model fetches
instead of a whole checkpoint, and the one fixed merge that turns them into weights.

An adapter version (payload "adapter", docs/shardcast.md) holds three files, in the layout the
`peft` library saves and loads:

    adapter_model.safetensors   lora_A [r, in] and lora_B [out, r] of every target module, float32,
                                named base_model.model.<module>.lora_{A,B}.weight
    adapter_config.json         peft's LoraConfig (r, lora_alpha, use_rslora, target_modules, ...)
    effective.json              {"merge": MERGE_RULE, "effective_sha256": ...}: the hash of the
                                weights the merge yields, stated by the trainer (signed with the
                                manifest like every file of the version)

The merge is defined bit for bit, so a worker, a validator and the trainer that published the
version compute with the same weights on any IEEE-754 hardware: for every target module, in
float32, D = sum over k = 0 .. r-1, in that order, of outer(B[:, k], A[k, :]), each product and
each sum rounded on its own (numpy's elementwise ufuncs: no BLAS, no fused multiply-add, no
reordering), then W_eff = W + float32(scale) * D with scale = lora_alpha / r (lora_alpha /
sqrt(r) under rsLoRA). A matrix product would be faster and is not reproducible: BLAS kernels
split and reorder the sum over k differently per CPU, thread count and library version.

Every byte is hostile until checked: the config is bounded and parsed field by field, the
adapter's tensors must be finite float32 of the shapes their base modules imply and come in
complete A/B pairs, and the merged weights must hash to `effective_sha256` (`AdapterError`
otherwise, and nothing is written in place of the output).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshrl.shardcast.errors import ShardcastError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_FILES",
    "ADAPTER_WEIGHTS",
    "EFFECTIVE",
    "MERGE_RULE",
    "AdapterError",
    "AdapterSpec",
    "materialize",
    "merge_weights",
    "read_adapter",
    "read_weights",
    "weights_sha256",
    "write_effective",
]

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
EFFECTIVE = "effective.json"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, EFFECTIVE)
MERGE_RULE = "meshrl-lora-merge-1"  # the rule of the module docstring; a new rule, a new name
MAX_CONFIG_BYTES = 64 << 10
MAX_RANK = 4096
_KEY = re.compile(r"^base_model\.model\.([A-Za-z0-9_.]{1,400})\.lora_([AB])\.weight$")


class AdapterError(ShardcastError, ValueError):
    """An adapter that is malformed, does not fit the base, or does not merge to the weights
    its version states."""


@dataclass(frozen=True)
class AdapterSpec:
    """What the merge needs of peft's adapter_config.json."""

    rank: int
    alpha: float
    rslora: bool = False

    @property
    def scale(self) -> np.float32:
        denom = math.sqrt(self.rank) if self.rslora else self.rank
        return np.float32(self.alpha / denom)

    @classmethod
    def from_config(cls, raw: bytes) -> AdapterSpec:
        """Parse (hostile) adapter_config.json; refuse what the merge does not define."""
        if len(raw) > MAX_CONFIG_BYTES:
            raise AdapterError(f"{ADAPTER_CONFIG}: {len(raw)} bytes, over {MAX_CONFIG_BYTES}")
        try:
            cfg = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise AdapterError(f"{ADAPTER_CONFIG}: not JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise AdapterError(f"{ADAPTER_CONFIG}: not a JSON object")
        if cfg.get("peft_type", "LORA") != "LORA":
            raise AdapterError(f"{ADAPTER_CONFIG}: peft_type {str(cfg.get('peft_type'))[:40]!r}"
                               " is not LORA")
        r, alpha = cfg.get("r"), cfg.get("lora_alpha")
        if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_RANK:
            raise AdapterError(f"{ADAPTER_CONFIG}: r must be an integer in 1..{MAX_RANK}")
        if not isinstance(alpha, int | float) or isinstance(alpha, bool) \
                or not math.isfinite(alpha) or alpha <= 0:
            raise AdapterError(f"{ADAPTER_CONFIG}: lora_alpha must be a finite number > 0")
        # what would change the effective weights in a way the merge rule does not define
        for key, ok in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
            if cfg.get(key, ok) != ok:
                raise AdapterError(f"{ADAPTER_CONFIG}: {key} must be {ok!r}")
        for key in ("modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern",
                    "lora_bias", "target_parameters", "trainable_token_indices",
                    "layer_replication"):
            if cfg.get(key):
                raise AdapterError(f"{ADAPTER_CONFIG}: {key} is not supported by {MERGE_RULE}")
        rslora = cfg.get("use_rslora", False)
        if not isinstance(rslora, bool):
            raise AdapterError(f"{ADAPTER_CONFIG}: use_rslora must be true or false")
        return cls(rank=r, alpha=float(alpha), rslora=rslora)


def weights_sha256(tensors: Mapping[str, np.ndarray]) -> str:
    """sha256 of named tensors, independent of how they are stored: per name in sorted order,
    the UTF-8 name, its dtype and shape, then its little-endian C-order bytes."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        h.update(f"{name}\0{a.dtype.str}\0{list(a.shape)}\0".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def read_weights(model_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every tensor of the model directory's safetensors files: {file name: {name: array}}."""
    from safetensors.numpy import load_file

    files = sorted(p for p in model_dir.glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        raise AdapterError(f"{model_dir}: the base holds no safetensors weights")
    return {p.name: load_file(str(p)) for p in files}


def read_adapter(adapter_dir: Path) -> tuple[AdapterSpec, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The spec and {module weight name: (A, B)} of an adapter directory, checked in form
    (complete pairs, float32, finite, rank `r`); their fit to a base is `merge_weights`'."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    spec = AdapterSpec.from_config(_read_bounded(adapter_dir / ADAPTER_CONFIG, MAX_CONFIG_BYTES))
    try:
        raw = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    except (SafetensorError, OSError, ValueError) as e:
        raise AdapterError(f"{ADAPTER_WEIGHTS}: unreadable ({str(e)[:200]})") from None
    halves: dict[str, dict[str, np.ndarray]] = {}
    for key, value in raw.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{ADAPTER_WEIGHTS}: unexpected tensor {key[:120]!r}")
        if value.dtype != np.float32 or value.ndim != 2:
            raise AdapterError(f"{ADAPTER_WEIGHTS}: {key[:120]} is not a float32 matrix")
        if not np.isfinite(value).all():
            raise AdapterError(f"{ADAPTER_WEIGHTS}: {key[:120]} holds a non-finite value")
        halves.setdefault(match[1] + ".weight", {})[match[2]] = value
    pairs = {}
    for name, half in halves.items():
        if set(half) != {"A", "B"}:
            raise AdapterError(f"{ADAPTER_WEIGHTS}: {name[:120]} lacks its lora_A or lora_B")
        a, b = half["A"], half["B"]
        if a.shape[0] != spec.rank or b.shape[1] != spec.rank:
            raise AdapterError(f"{ADAPTER_WEIGHTS}: {name[:120]} is not of rank {spec.rank}")
        pairs[name] = (a, b)
    if not pairs:
        raise AdapterError(f"{ADAPTER_WEIGHTS}: no lora_A / lora_B pair")
    return spec, pairs


def merge_weights(
    base: Mapping[str, np.ndarray], spec: AdapterSpec,
    pairs: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, np.ndarray]:
    """The merged float32 weight of every module of `pairs` found in `base` (MERGE_RULE, module
    docstring); the names of `pairs` not in `base` are left for the caller to refuse."""
    out = {}
    scale = spec.scale
    for name, (a, b) in pairs.items():
        if name not in base:
            continue
        w = base[name]
        if w.ndim != 2 or w.shape != (b.shape[0], a.shape[1]):
            raise AdapterError(f"{name[:120]}: lora shapes {b.shape} x {a.shape} do not fit the "
                               f"base weight {w.shape}")
        delta = np.zeros(w.shape, dtype=np.float32)
        column = np.empty(w.shape, dtype=np.float32)
        for k in range(spec.rank):  # in rank order, one rounding per product and per sum
            np.multiply.outer(b[:, k], a[k, :], out=column)
            np.add(delta, column, out=delta)
        np.multiply(delta, scale, out=delta)
        out[name] = np.add(w.astype(np.float32, copy=False), delta, dtype=np.float32)
    return out


def write_effective(adapter_dir: Path, effective_sha256: str) -> None:
    """The trainer's statement of the weights its adapter merges to."""
    body = {"merge": MERGE_RULE, "effective_sha256": effective_sha256}
    (adapter_dir / EFFECTIVE).write_text(json.dumps(body, sort_keys=True) + "\n")


def _stated_sha256(adapter_dir: Path) -> str:
    try:
        body = json.loads(_read_bounded(adapter_dir / EFFECTIVE, 4096))
    except (ValueError, UnicodeDecodeError):
        raise AdapterError(f"{EFFECTIVE}: not JSON") from None
    if not isinstance(body, dict) or body.get("merge") != MERGE_RULE:
        raise AdapterError(f"{EFFECTIVE}: merge rule is not {MERGE_RULE!r}")
    digest = body.get("effective_sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise AdapterError(f"{EFFECTIVE}: effective_sha256 is not a sha256")
    return digest


def materialize(adapter_dir: Path, base_dir: Path, out: Path) -> str:
    """Write the full model directory of an adapter version to `out` (created, must not exist):
    the base's files with every target weight merged (same safetensors file layout), plus the
    adapter's own files under `out/adapter/`. Returns the effective weights' sha256, which must
    be the one the version states (`AdapterError` otherwise, and `out` is not created)."""
    spec, pairs = read_adapter(adapter_dir)
    stated = _stated_sha256(adapter_dir)
    files = read_weights(base_dir)
    every: dict[str, np.ndarray] = {}
    for tensors in files.values():
        merged = merge_weights(tensors, spec, pairs)
        tensors.update(merged)
        every.update(tensors)
    unknown = sorted(set(pairs) - set(every))
    if unknown:
        raise AdapterError(f"the adapter targets {unknown[0][:120]!r}, which the base lacks")
    digest = weights_sha256(every)
    if digest != stated:
        raise AdapterError(f"the merged weights hash to {digest[:16]}..., the version states "
                           f"{stated[:16]}...: not the trainer's weights")
    from safetensors.numpy import save_file

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.merge-", dir=out.parent))
    try:
        for p in base_dir.iterdir():
            if p.is_file() and p.suffix != ".safetensors":
                shutil.copyfile(p, tmp / p.name)
        for name, tensors in files.items():
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
        (tmp / "adapter").mkdir()
        for name in ADAPTER_FILES:
            shutil.copyfile(adapter_dir / name, tmp / "adapter" / name)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return digest


def _read_bounded(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise AdapterError(f"{path.name}: unreadable ({e.strerror})") from None
    if len(data) > limit:
        raise AdapterError(f"{path.name}: over {limit} bytes")
    return data
