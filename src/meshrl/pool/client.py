"""The one client of the pool's published rules (`GET /rules`), and the refusal of a role whose
configuration disagrees with them."""

from __future__ import annotations

import asyncio
import contextlib

from meshrl.log import get_logger, log_event
from meshrl.pool.rules import PoolRules, RulesPins, rules_diff, rules_drift
from meshrl.wire import SignedClient, Transient, WireHTTPError

__all__ = ["PoolRulesError", "changed_rules", "check_rules", "read_rules", "require_same_rules"]

log = get_logger("meshrl.pool")


class PoolRulesError(RuntimeError):
    """The pool's published rules are not ones this role may work under: another pool, a rule
    its configuration pins to another value, a proof profile its compute cannot meet, or rules
    that changed while it ran. Refused for good (`EXIT_REFUSED`): a restart cannot help."""


async def read_rules(orch: SignedClient, stop: asyncio.Event,
                     poll_s: float = 1.0) -> PoolRules | None:
    """The pool's published rules, waiting while the orchestrator does not answer yet; None when
    `stop` is set first. A 4xx answer (other than 429), or an answer that is not valid rules
    (not JSON, or out of the rules' bounds), is a refusal: nothing can be judged or generated
    by rules that cannot be read."""
    while not stop.is_set():
        try:
            return await orch.call("GET", "/rules", response=PoolRules)
        except ValueError as e:  # a malformed body: JSON or the model's validation
            raise PoolRulesError(f"the pool's published rules are not valid rules: "
                                 f"{str(e).splitlines()[0][:300]}") from None
        except (WireHTTPError, OSError) as e:
            if isinstance(e, WireHTTPError) and not isinstance(e, Transient):
                raise PoolRulesError(f"cannot read the pool's rules: {e}") from None
            log_event(log, "pool rules not readable yet", error=str(e))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
    return None


def check_rules(rules: PoolRules, pool_id: int | None, pins: RulesPins, role: str) -> None:
    """Refuse (`PoolRulesError`, one line naming the field) rules of another pool or rules that
    differ from a value this role's `[rules]` pins (`pool_id` None: any pool)."""
    if pool_id is not None and rules.pool_id != pool_id:
        raise PoolRulesError(f"refusing to start: the orchestrator manages pool {rules.pool_id}, "
                             f"this {role}'s pool_id is {pool_id}")
    drift = rules_drift(pins, rules)
    if drift:
        raise PoolRulesError(f"refusing to start, this {role}'s [rules] differ from the pool's "
                             f"published rules: {'; '.join(drift)} (pin the published value "
                             "or leave the rule unset)")


def changed_rules(started: PoolRules, now: PoolRules) -> str | None:
    """Why rules seen while running differ from those the role started with (None: same), one
    line naming each field that changed."""
    found = rules_diff(RulesPins.of(started), now)
    diff = [f"rules.{path}: started with {a!r}, the pool now publishes {b!r}"
            for path, a, b in found]
    # a rule the role started without (e.g. no policy_signer) pins nothing: compare it too
    seen = {path.split(".")[0] for path, _, _ in found} | {"pool_id"}
    was, new = started.model_dump(mode="json"), now.model_dump(mode="json")
    diff += [f"rules.{k}: started with {was[k]!r}, the pool now publishes {new[k]!r}"
             for k in was if k not in seen and was[k] != new[k]]
    if now.pool_id != started.pool_id:
        diff.insert(0, f"pool_id: started with {started.pool_id}, now {now.pool_id}")
    if not diff:
        return None
    return "stopping, the pool's rules changed while running: " + "; ".join(diff)


def require_same_rules(started: PoolRules, now: PoolRules) -> None:
    """Rules seen while running (a work order's, a re-read of `GET /rules`) are the ones the
    role started under, or it stops for good (`PoolRulesError`, `changed_rules`' line)."""
    why = changed_rules(started, now)
    if why is not None:
        raise PoolRulesError(why)
