"""Typed configuration: pydantic models loaded from TOML files plus dotted command-line overrides.

Every role's config is a tree of `Config` models. Unknown keys are errors that name the key
(with a close match when there is one); values from overrides are parsed as TOML literals, so
`--trainer.lr 3e-6`, `--tasks.names '["arithmetic"]'` and `--run.name demo` all work.
This module must stay light (no torch) so `--help` answers fast.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_REFUSED",
    "CommandError",
    "Config",
    "ConfigError",
    "InputError",
    "Interrupted",
    "add_config_command",
    "config_help",
    "load_config",
    "parse_overrides",
]

C = TypeVar("C", bound="Config")


class Config(BaseModel):
    """Base of every config model: unknown keys are refused, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class ConfigError(ValueError):
    """A configuration that cannot be loaded: bad TOML, unknown key, or invalid value."""


# Exit status of a role refused for good (e.g. a node blacklisted by its pool): restarting it
# cannot help, so a supervisor retires it instead of restarting it.
EXIT_REFUSED = 3


class CommandError(Exception):
    """An expected failure of a command (missing file, bad model directory, unreachable server):
    `meshrl` prints it as one line naming the problem and exits with `exit_code` (1, or
    `EXIT_REFUSED` when retrying cannot help), without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class InputError(CommandError, ValueError):
    """Bad input the user gave, found where it is read rather than when the config is parsed
    (a dataset without its answer field, an unknown task, a model directory that is missing or
    of an unknown family): one line and exit status 2, like an invalid config. Each package's
    input errors derive from it, so a command needs no handler per error type; it stays a
    `ValueError` for callers that catch those."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message, exit_code)


# Exit status of a command stopped by Ctrl-C (SIGINT), as a shell reports it (128 + 2).
EXIT_INTERRUPTED = 130


class Interrupted(CommandError):
    """A command stopped by Ctrl-C: one line saying what was kept, exit status 130."""

    def __init__(self, message: str = "interrupted") -> None:
        super().__init__(message, EXIT_INTERRUPTED)


def _parse_value(raw: str) -> Any:
    if raw[:2] in ("0x", "0X"):
        return raw  # addresses, keys and hashes: TOML would read them as integers
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare string such as a path or a name


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn `--a.b value` / `--a.b=value` / `--flag` (=true) into a nested dict."""
    return _parse_overrides(args)[0]


def _parse_overrides(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The nested overrides and the dotted keys given without a value (`--flag`)."""
    nested: dict[str, Any] = {}
    bare: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected an override like --section.key value, got {arg!r}")
        key, sep, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        if not sep:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            else:
                value = "true"
                bare.append(key)
        _set_dotted(nested, key, _parse_value(value))
        i += 1
    return nested, bare


def _check_bare_flags(cls: type[BaseModel], keys: list[str]) -> None:
    """A key given without a value means true, so only a boolean key may be: `--steps` alone
    would otherwise be read as 1 and start a run of one step."""
    for key in keys:
        annotation = _field_annotation(cls, key)
        if annotation is not None and not _is_bool(annotation):
            raise ConfigError(f"--{key} needs a value (--{key} VALUE)")


def _field_annotation(cls: type[BaseModel], dotted: str) -> Any:
    """The annotation of a dotted key of `cls`; None for a key it does not have."""
    model: type[BaseModel] | None = cls
    annotation: Any = None
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = _model_type(annotation)
    return annotation


def _is_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return bool in typing.get_args(annotation)
    return False


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _dotted_fields(cls: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, field in cls.model_fields.items():
        sub = _model_type(field.annotation)
        names.append(prefix + name)
        if sub is not None:
            names.extend(_dotted_fields(sub, prefix + name + "."))
    return names


def _model_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        models = [a for a in typing.get_args(annotation) if _model_type(a)]
        if len(models) == 1:
            return _model_type(models[0])
    return None


def _explain(cls: type[BaseModel], err: ValidationError) -> str:
    known = _dotted_fields(cls)
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(key, known, n=1)
            lines.append(f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        else:
            lines.append(f"{key}: {e['msg']}")
    return "invalid config: " + "; ".join(lines)


def load_config(cls: type[C], files: list[str | Path] = (), overrides: list[str] = ()) -> C:  # type: ignore[assignment]
    """Build `cls` from TOML files (merged in order) and dotted overrides (applied last)."""
    data: dict[str, Any] = {}
    for path in files:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = _merge(data, tomllib.loads(path.read_text()))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from e
    nested, bare = _parse_overrides(list(overrides))
    _check_bare_flags(cls, bare)
    data = _merge(data, nested)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(cls, e)) from None


def config_help(cls: type[BaseModel], prefix: str = "") -> str:
    """One line per option: `--dotted.key  (type, default)  description`."""
    lines = []
    for name, field in cls.model_fields.items():
        sub = _model_type(field.annotation)
        if sub is not None:
            lines.append(config_help(sub, prefix + name + "."))
            continue
        tname = getattr(field.annotation, "__name__", None) or str(field.annotation)
        tname = tname.replace("typing.", "")
        default = field.get_default(call_default_factory=True)
        desc = f"  {field.description}" if field.description else ""
        lines.append(f"  --{prefix}{name}  ({tname}, default: {default!r}){desc}")
    return "\n".join(line for line in lines if line)


def add_config_command(
    subparsers: Any,
    name: str,
    config_cls: type[Config],
    handler: Callable[[Any], int | None],
    help: str,
    positional: str = "",
    positional_optional: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand parsing TOML files + dotted overrides into `config_cls`, then `handler(cfg)`.
    With `positional`, the first argument is that config key's value (`meshrl worker join URL`),
    and config files follow it; `positional_optional` lets it be left out (set it by its
    `--key`, or another key names the input: `meshrl model import --package NAME`).

    It lives here, below every package, so a package's `cli.py` registers its commands without
    importing the `meshrl` command line (which imports every package's `cli.py`).
    """
    parser = subparsers.add_parser(
        name,
        help=help,
        description=help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="options (as --dotted.key VALUE, after the config files):\n"
        + config_help(config_cls),
    )
    if positional:
        parser.add_argument(positional, help=f"sets --{positional}",
                            nargs="?" if positional_optional else None)
    parser.add_argument("configs", nargs="*", help="TOML config files, merged in order")
    parser.set_defaults(_config_cls=config_cls, _handler=handler, _positional=positional)
    return parser
