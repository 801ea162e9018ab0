"""The pool's TOPLOC proof profile, read before staking: can this worker be judged fairly by it?

The profile is a public rule of the pool (`GET /rules`, and every work order): it names the
thresholds its validators apply (docs/roles.md). "meshrl-cpu-engine" is honest only for workers
that compute like meshrl's CPU engine (float32), whose proofs a CPU-engine validator recomputes
nearly bit-exactly; its pooled tests are tight enough to slash honest bfloat16 work. A worker
that cannot meet its pool's profile refuses before it stakes rather than risk its stake.
"""

from __future__ import annotations

import asyncio
import contextlib

from meshrl.log import get_logger, log_event
from meshrl.wire import SignedClient, WireHTTPError
from meshrl.wire.models import PublishedRules
from meshrl.worker.config import WorkerConfig

__all__ = ["PoolRulesError", "read_rules", "require_profile", "unmet_profile"]

log = get_logger("meshrl.worker")


class PoolRulesError(RuntimeError):
    """The pool's published rules are not ones this worker can work under (another pool, a
    proof profile its setup cannot be judged fairly by)."""


def unmet_profile(cfg: WorkerConfig, profile: str) -> str | None:
    """Why this worker cannot work under `profile`, or None when it can.

    "meshrl-cpu-engine" needs float32 compute: the engine, or the reference loop in float32
    (the same hidden states to within 6e-5 bf16 units on the demo's files), never bfloat16,
    whose honest files its pooled tests reject (pooled exponent mismatch rate 0.012-0.024 >
    0.005, tests/worker/test_worker_profile.py).
    """
    if profile == "meshrl-cpu-engine" and cfg.dtype != "float32":
        return (f"the pool's proof profile 'meshrl-cpu-engine' holds only for float32 compute "
                f"as in meshrl's CPU engine, and this worker computes in {cfg.dtype} (backend "
                f"{cfg.backend!r}): its honest files would be slashed; set dtype = "
                f"\"float32\", or work for a pool with proof profile 'any-hardware'")
    return None


def require_profile(cfg: WorkerConfig, profile: str) -> None:
    why = unmet_profile(cfg, profile)
    if why is not None:
        raise PoolRulesError(why)


async def read_rules(orch: SignedClient, cfg: WorkerConfig,
                     stop: asyncio.Event) -> PublishedRules | None:
    """The pool's published rules (waiting for an orchestrator that does not answer yet);
    None when stopped first. Refuses another pool's or an unmeetable proof profile."""
    rules: PublishedRules | None = None
    while rules is None:
        if stop.is_set():
            return None
        try:
            rules = await orch.call("GET", "/rules", response=PublishedRules)
        except (WireHTTPError, OSError) as e:
            if isinstance(e, WireHTTPError) and 400 <= e.status < 500 and e.status != 429:
                raise PoolRulesError(f"cannot read the pool's rules: {e}") from None
            log_event(log, "pool rules not readable yet", error=str(e))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.poll_interval)
    if rules.pool_id != cfg.pool_id:
        raise PoolRulesError(f"the orchestrator at {cfg.orchestrator_url} manages pool "
                                f"{rules.pool_id}, this worker's pool_id is {cfg.pool_id}")
    require_profile(cfg, rules.proof_profile)
    log_event(log, "pool rules", pool=rules.pool_id, proof_profile=rules.proof_profile,
              backend=cfg.backend)
    return rules
