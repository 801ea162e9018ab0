"""Pacing: the pool makes what the trainer will take, not what its members could make.

Without it every member makes its `files_per_step` counters of every policy version, however
few of them the trainer needs: the surplus is generated, uploaded, submitted, judged and paid
for, and then dropped as stale (a file of version v is usable only up to step v + async_level),
while it holds the cores and the validator the trainer waits on.

The trainer says what it will take (`POST /step`: it has taken every accepted file up to
acceptance number `taken_through`, and wants `ahead` files beyond those). The pool's backlog is
every granted file of a fresh version (>= step - async_level) the trainer has not taken:
granted or uploaded by a live node, submitted, or accepted after `taken_through`
(`State.backlog`). A node's
work order wants one file when the backlog plus the leases of other nodes is below `ahead`; that
want is a lease held by the node until its file is granted a slot (it is in the backlog then),
its next work order or `lease_s`, so members asking at once do not all make the last file
wanted. A node that cannot make a file now holds no lease:
one whose last word (its work order's `version`, else its heartbeat) names a policy version
the pool no longer takes or the oldest it still takes (a file of it would be usable only by the
step being filled now, and mostly arrive too late for it), or that used its
`files_per_step` counters of that version (the want goes to the others). The demand is
shared: a node holding ceil(ahead / n) files of the backlog waits, n being the nodes that asked
for work within `lease_s` and can make a file, so the first node to ask after each move does
not make the whole step (a fast asker took every file of a step, and a late joiner none); a
node that heartbeats but never asks is not counted, so it cannot hold others back. An
invalidated or
expired file leaves the backlog, so its place is made again. Without a demand (a trainer that
never said, or `ahead` None) the pool is not paced.

Hostile members (docs/services.md, "Pacing"). A lease is not renewed by asking again: it runs
out `lease_s` after the work order that took it, and a node whose lease ran out without a file
granted waits `lease_s` before it may take another (asking alone never holds a place for
longer than `lease_s`; an honest node that was only slow loses the place to an asker, not its
file). An upload counts in flight only for `submit_s` after it arrived: a file not submitted
on chain by then stops holding a place, and its node is wanted no file (and granted no slot,
api.py) until it submits it or `unsubmitted_penalty_s` pass, so uploading without submitting
costs the node its own work, not the pool its demand.

A work order asked with `wait` is held while the pool wants no file from a node that could
make one (hold.py): it is answered when the trainer's next word, a grant, an invalidation or a
lease running out makes a place, so an idle node learns of the demand at once, not at its next
poll.

The demand lives in the state's meta table: a restarted orchestrator keeps pacing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import NamedTuple

from meshrl.orchestrator.state import PoolStep, State

__all__ = ["Demand", "Pacer", "Want"]

DEMAND = "trainer_demand"  # meta key


@dataclass(frozen=True)
class Demand:
    """What the trainer will take: `ahead` files beyond acceptance number `taken_through`."""

    taken_through: int
    ahead: int


class Want(NamedTuple):
    """A work order's answer: `files` to make now (None without a demand), why none, and
    whether the node itself must fetch a newer version first (no wait for demand helps)."""

    files: int | None
    why: str
    must_fetch: bool = False


class Pacer:
    """The files each node's work order wants now (module docstring)."""

    def __init__(self, state: State, pool: PoolStep, lease_s: float,
                 files_per_step: int, submit_s: float = 300.0,
                 unsubmitted_penalty_s: float = 600.0) -> None:
        self.state, self.pool, self.lease_s = state, pool, lease_s
        self.files_per_step = files_per_step
        self.submit_s, self.penalty_s = submit_s, unsubmitted_penalty_s
        raw = state.get_meta(DEMAND)
        self.demand: Demand | None = Demand(**json.loads(raw)) if raw else None
        self.leases: dict[str, float] = {}  # node (lower case) -> lease expiry (monotonic)
        # node (lower case) -> until when it may take no lease (its last one ran out unused)
        self.cooling: dict[str, float] = {}
        self.asked: dict[str, float] = {}  # node as it asked -> when it last asked (monotonic)

    def set_demand(self, taken_through: int | None, ahead: int | None) -> None:
        """The trainer's latest word (`ahead` None: stop pacing). `taken_through` never goes
        back (a resumed trainer may re-take files it lost; the pool made them already)."""
        if ahead is None:
            self.demand = None
            self.state.set_meta(DEMAND, "")
            return
        before = self.demand.taken_through if self.demand else 0
        self.demand = Demand(max(before, taken_through or 0), ahead)
        self.state.set_meta(DEMAND, json.dumps(self.demand.__dict__))

    def granted(self, node: str) -> None:
        """`node`'s file was granted a slot: it is in the backlog now, so the lease that held
        its place is given back (counted twice until the node's next work order, it kept
        others waiting while the file was uploaded and submitted); a node that makes files
        is not cooling down."""
        self.leases.pop(node.lower(), None)
        self.cooling.pop(node.lower(), None)
        self.state.alarm.ring()

    def backlog(self, node: str | None = None) -> int:
        """Fresh files the trainer has not taken (0 without a demand); of `node` alone when
        it is given."""
        if self.demand is None:
            return 0
        return self.state.backlog(self.demand.taken_through, min(self.pool.versions()),
                                  time.time() - self.submit_s, node)

    def overdue(self, node: str) -> int:
        """`node`'s uploads past their submission deadline, within the penalty's time."""
        deadline = time.time() - self.submit_s
        return self.state.overdue_uploads(node, deadline, deadline - self.penalty_s)

    def owes(self, node: str) -> str:
        """Why `node` may not make a file because of uploads it did not submit ("" if none)."""
        late = self.overdue(node)
        if not late:
            return ""
        return (f"this node uploaded {late} file(s) it did not submit on chain within "
                f"{self.submit_s:g} s: submit them (or wait up to "
                f"{self.penalty_s:g} s) before it makes more")

    def want(self, node: str, now: float) -> Want:
        """What `node` should make now: no count without a demand; 1 with a lease for it, or
        0 and the reason (`must_fetch` when the node's own version is what stands in the way,
        not the pool having enough)."""
        if self.demand is None:
            return Want(None, "")
        key = node.lower()
        for n, t in self.leases.items():
            if t <= now:  # ran out without a file granted: others first for lease_s
                self.cooling[n] = t + self.lease_s
        mine = self.leases.get(key)
        self.leases = {n: t for n, t in self.leases.items() if t > now and n != key}
        self.cooling = {n: t for n, t in self.cooling.items() if t > now}
        self.asked = {n: t for n, t in self.asked.items() if t > now - self.lease_s}
        self.asked[node] = now
        cannot = self.cannot(node)
        if cannot:
            return Want(0, cannot, must_fetch=True)
        owes = self.owes(node)
        if owes:
            return Want(0, owes)
        backlog, leased = self.backlog(), len(self.leases)
        if backlog + leased < self.demand.ahead:
            unfair = self._over_share(node, self.demand)
            if unfair:
                return Want(0, unfair)
            if mine is not None and mine > now:  # asking again keeps the lease, not renews it
                self.leases[key] = mine
                return Want(1, "")
            if key in self.cooling:
                return Want(0, f"this node's last lease ran out without a file: it may take "
                               f"another in {self.cooling[key] - now:.1f} s")
            self.leases[key] = now + self.lease_s
            return Want(1, "")
        return Want(0, f"the trainer's demand is met: {backlog} files in flight or waiting "
                       f"and {leased} being made, it wants {self.demand.ahead} ahead")

    def _over_share(self, node: str, demand: Demand) -> str:
        """Why `node` leaves the next file to others ("" if it may make it): it holds its
        share of `demand` among the nodes that asked and can make a file."""
        able = self.state.able_nodes(list(self.asked), self.pool.versions(),
                                     self.files_per_step)
        if able <= 1:
            return ""
        share = -(-demand.ahead // able)
        own = self.backlog(node)
        if own < share:
            return ""
        return (f"this node holds its share of the demand: {own} of {demand.ahead} files "
                f"ahead, shared by {able} nodes that can make one")

    def cannot(self, node: str) -> str:
        """Why `node` cannot make a file now ("" if it can), by the policy version it last
        named (in a work order or a heartbeat)."""
        row = self.state.node(node)
        version = -1 if row is None else row.policy_version
        versions = self.pool.versions()
        if version not in versions:
            return (f"this node's policy version {version} is not one the pool takes "
                    f"({versions}): fetch a newer one")
        if len(versions) > 1 and version == min(versions):
            # usable only by the step the trainer is filling now, which a file made from here
            # (generated, uploaded, submitted, judged) mostly misses: it would be dropped stale
            return (f"this node's policy version {version} is the oldest the pool takes "
                    f"({versions}): its file would be usable only by the step being filled "
                    "now; fetch a newer one")
        if self.state.granted_count(node, version) >= self.files_per_step:
            return (f"this node made its {self.files_per_step} files of version {version}: "
                    "the next version's counters are its next work")
        return ""

    def status(self, now: float) -> dict[str, int | None]:
        """For `/health` and the stall log: the demand, the backlog and the live leases."""
        live = sum(t > now for t in self.leases.values())
        return {"ahead": None if self.demand is None else self.demand.ahead,
                "taken_through": None if self.demand is None else self.demand.taken_through,
                "backlog": self.backlog(), "leases": live,
                "cooling": sum(t > now for t in self.cooling.values())}
