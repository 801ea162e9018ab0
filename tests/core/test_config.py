from pathlib import Path

import pytest
from pydantic import Field

from meshrl.cli import main
from meshrl.config import Config, ConfigError, config_help, load_config, parse_overrides


class Optim(Config):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)


class Run(Config):
    name: str = "demo"
    steps: int = Field(10, description="number of steps")
    optim: Optim = Optim()
    tags: list[str] = []
    dry: bool = False
    trace: bool | None = None


def test_overrides_parse_toml_literals_and_strings() -> None:
    got = parse_overrides(["--optim.lr", "3e-6", "--name=x/y", "--tags", '["a", "b"]', "--flag"])
    assert got == {"optim": {"lr": 3e-6}, "name": "x/y", "tags": ["a", "b"], "flag": True}
    addr = "0x00000000000000000000000000000000000000aB"
    assert parse_overrides(["--to", addr]) == {"to": addr}  # hex stays a string


def test_files_merge_in_order_then_overrides(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text('name = "a"\nsteps = 5\n[optim]\nlr = 0.1\n')
    b = tmp_path / "b.toml"
    b.write_text("[optim]\nbetas = [0.8, 0.9]\n")
    cfg = load_config(Run, [a, b], ["--steps", "7"])
    assert (cfg.name, cfg.steps, cfg.optim.lr, cfg.optim.betas) == ("a", 7, 0.1, (0.8, 0.9))


def test_a_key_without_its_value_is_true_for_booleans_only() -> None:
    cfg = load_config(Run, [], ["--dry", "--trace", "--steps", "3"])
    assert (cfg.dry, cfg.trace, cfg.steps) == (True, True, 3)
    # `--steps` alone would be read as true, which pydantic takes as 1: a run of one step
    for args in (["--steps"], ["--steps", "--dry"], ["--optim.lr"], ["--optim"]):
        with pytest.raises(ConfigError, match=f"^{args[0]} needs a value"):
            load_config(Run, [], args)
    with pytest.raises(ConfigError, match="unknown key 'stps'"):  # named as before
        load_config(Run, [], ["--stps"])


def test_unknown_key_is_named_with_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr' \(did you mean 'optim.lr'\?\)"):
        load_config(Run, [], ["--optim.lrr", "1"])


def test_bad_value_and_missing_file_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="steps"):
        load_config(Run, [], ["--steps", "many"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(Run, [tmp_path / "nope.toml"])
    bad = tmp_path / "bad.toml"
    bad.write_text("x = = 1")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(Run, [bad])


def test_help_lists_dotted_options_with_defaults() -> None:
    text = config_help(Run)
    assert "--optim.lr  (float, default: 0.001)" in text
    assert "--steps  (int, default: 10)  number of steps" in text


def test_cli_reports_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "init", "--presett", "x"]) == 2
    assert "unknown key 'presett'" in capsys.readouterr().err
