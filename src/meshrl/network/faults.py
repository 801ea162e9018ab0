"""Fault injection (`meshrl network up --faults FILE`): `kill -9` of roles at configured times,
and how long the supervisor took to notice each death and to have the role back.

FILE is TOML with one `[[kill]]` table per fault: `role` (a role name: `worker-1`, `relay-0`,
`validator`, `trainer`, `orchestrator`, ...) and `at_s` (seconds after every role started).
Detected = the supervisor saw the process gone; recovered = the restarted process is up and, for
a service, answers `/health`; for a role without a health URL, has stayed up `settle_s`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from meshrl.config import Config, load_config
from meshrl.network.supervisor import Supervisor, healthy

__all__ = ["FaultPlan", "FaultRecord", "Faults", "KillSpec"]


class KillSpec(Config):
    role: str = Field(description="the role to kill -9")
    at_s: float = Field(ge=0, description="seconds after every role started")


class FaultPlan(Config):
    kill: list[KillSpec] = Field(default_factory=list, description="kill -9 faults")
    settle_s: float = Field(10.0, gt=0, description="a role without /health counts as "
                            "recovered after staying up this long")


@dataclass
class FaultRecord:
    role: str
    at_s: float
    killed_at: float = 0.0
    pid: int = 0
    detect_s: float | None = None
    recover_s: float | None = None


class Faults:
    """The plan, applied one supervision round at a time."""

    def __init__(self, path: str, roles: list[str]) -> None:
        self.plan = load_config(FaultPlan, [path]) if path else FaultPlan()
        unknown = {k.role for k in self.plan.kill} - set(roles)
        if unknown:
            raise ValueError(f"faults: no role named {sorted(unknown)} (roles: {roles})")
        self.records = [FaultRecord(k.role, k.at_s) for k in
                        sorted(self.plan.kill, key=lambda k: k.at_s)]
        self.t0: float | None = None

    def tick(self, sup: Supervisor) -> None:
        now = time.time()
        if self.t0 is None:
            self.t0 = now
        for r in self.records:
            p = sup.procs[r.role]
            if not r.killed_at and now - self.t0 >= r.at_s and not p.done:
                if p.popen is not None and p.popen.poll() is None:
                    r.pid, r.killed_at = sup.kill(r.role), time.time()
            elif r.killed_at and r.detect_s is None and (p.due or p.popen.pid != r.pid):
                r.detect_s = time.time() - r.killed_at
            elif r.detect_s is not None and r.recover_s is None and self._back(p, r):
                r.recover_s = time.time() - r.killed_at
                sup.event("recovered", r.role, detect_s=round(r.detect_s, 2),
                          recover_s=round(r.recover_s, 2))

    def _back(self, p: Any, r: FaultRecord) -> bool:
        if p.popen is None or p.popen.pid == r.pid or p.popen.poll() is not None:
            return False
        if p.spec.health:
            return healthy(p.spec)
        return time.monotonic() - p.started >= self.plan.settle_s

    def summary(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]

    def write(self, path: Path) -> None:
        import json

        path.write_text(json.dumps(self.summary(), indent=1))
