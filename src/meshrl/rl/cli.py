"""`meshrl train` and `meshrl eval` (top-level commands; light imports only)."""

from __future__ import annotations

from typing import Any

from meshrl.rl.config import EvalCommandConfig, RLConfig

__all__ = ["register"]


def _train(cfg: RLConfig) -> int:
    import json
    import os

    from meshrl.model.families import check_model_dir

    if cfg.model.path:  # before torch is imported: a wrong path is refused in a second
        check_model_dir(cfg.model.path)
    import signal

    from meshrl.config import EXIT_REFUSED, CommandError
    from meshrl.pool import PoolRulesError
    from meshrl.rl.distributed import launched_by_torchrun

    def on_sigterm(_n: int, _f: object) -> None:
        raise KeyboardInterrupt  # a supervisor's stop is a Ctrl-C: progress saved, one line

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if launched_by_torchrun(os.environ):  # one rank of a torchrun job: FSDP2 (dist_run.py)
            from meshrl.rl.dist_run import train_distributed

            summary = train_distributed(cfg, os.environ)
        else:
            from meshrl.rl.loop import train

            summary = train(cfg)
    except PoolRulesError as e:  # the pool's rules are not the trainer's: a restart cannot help
        raise CommandError(str(e), EXIT_REFUSED) from None
    print(json.dumps(summary))
    return 0


def _eval(cfg: EvalCommandConfig) -> int:
    import json
    from pathlib import Path

    from meshrl.model.families import ModelNotFoundError

    if not Path(cfg.checkpoint).exists():  # before torch is imported
        raise ModelNotFoundError(f"model directory {cfg.checkpoint} does not exist")
    from meshrl.rl.evaluate import evaluate_checkpoint

    print(json.dumps(evaluate_checkpoint(cfg)))
    return 0


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "train", RLConfig, _train,
                       "supervised warm-start, then asynchronous RL (resumes a run's checkpoint)")
    add_config_command(subparsers, "eval", EvalCommandConfig, _eval,
                       "greedy held-out accuracy of a model, checkpoint or run, as JSON")
