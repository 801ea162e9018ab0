"""`meshrl validator` (light imports only: torch loads after the command line is parsed)."""

from __future__ import annotations

from typing import Any

from meshrl.validator.config import ValidatorConfig

__all__ = ["register", "run_validator"]


def _validator(cfg: ValidatorConfig) -> int:
    from meshrl.config import InputError

    if cfg.rogue.mode != "none":
        raise InputError(f"rogue.mode = {cfg.rogue.mode!r} runs only as `meshrl adversary "
                           "validator` (tests and demos of disputes): `meshrl validator` is "
                           "honest")
    return run_validator(cfg)


def run_validator(cfg: ValidatorConfig, amend: Any = None) -> int:
    """`meshrl validator`'s work, with the verdict hook `amend` (None: honest); an expected
    failure becomes one line."""
    import asyncio

    from meshrl.config import EXIT_REFUSED, CommandError
    from meshrl.inference.device import DeviceError, check_device
    from meshrl.pool import PoolRulesError
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import connect
    from meshrl.validator.keys import ValidatorKeyError, load_validator_key
    from meshrl.validator.node import ValidatorNode
    from meshrl.wire.detached import exit_now

    try:
        check_device(cfg.device, cfg.dtype)  # before anything: a device it lacks is refused
    except DeviceError as e:
        raise CommandError(str(e), EXIT_REFUSED) from None
    try:
        account = load_validator_key(cfg.keys, connect(cfg.chain).chain_id)
        rc = asyncio.run(ValidatorNode(cfg, account, amend).run())
        exit_now(rc)  # a judgement a stop abandoned is not waited for
        return rc
    except PoolRulesError as e:  # rules it may not judge by: a restart cannot help
        raise CommandError(str(e), EXIT_REFUSED) from None
    except (ValidatorKeyError, ChainError) as e:  # one line, not a traceback
        raise CommandError(str(e)) from None


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "validator", ValidatorConfig, _validator,
                       "verify every rollout file submitted to a pool; accept or invalidate")
