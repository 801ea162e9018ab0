"""What a worker checks of the pool's published rules before it stakes, and while it works.

The rules are read with the one rules client (`meshrl.pool.read_rules`). A worker refuses
(`meshrl.pool.PoolRulesError`, exit `EXIT_REFUSED`) rules of another pool, rules that differ
from a value its `[rules]` pins, and a proof profile its compute cannot meet: "meshrl-cpu-engine"
is honest only for float32 compute (`meshrl.pool.unmet_profile`); its pooled tests are tight
enough to slash honest bfloat16 work. Rules that change while it works stop it the same way.
"""

from __future__ import annotations

import asyncio

from meshrl.log import get_logger, log_event
from meshrl.pool import PoolRules, PoolRulesError, check_rules, read_rules
from meshrl.pool import unmet_profile as _unmet
from meshrl.wire import SignedClient
from meshrl.worker.config import WorkerConfig

__all__ = ["accepted_rules", "unmet_profile"]

log = get_logger("meshrl.worker")


def unmet_profile(cfg: WorkerConfig, profile: str) -> str | None:
    """Why this worker cannot work under proof profile `profile`, or None when it can (the
    engine always computes in float32; the reference backend in `cfg.dtype`)."""
    return _unmet(profile, cfg.dtype, cfg.backend)


async def accepted_rules(orch: SignedClient, cfg: WorkerConfig,
                         stop: asyncio.Event) -> PoolRules | None:
    """The pool's published rules, if this worker may work under them (else `PoolRulesError`);
    None when stopped before the orchestrator answered."""
    rules = await read_rules(orch, stop, cfg.poll_interval)
    if rules is None:
        return None
    check_rules(rules, cfg.pool_id, cfg.rules, "worker")
    why = unmet_profile(cfg, rules.proof_profile)
    if why is not None:
        raise PoolRulesError(why)
    log_event(log, "pool rules", pool=rules.pool_id, proof_profile=rules.proof_profile,
              backend=cfg.backend)
    return rules
