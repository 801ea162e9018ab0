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

Turnaround (`work.turnaround_orders`; `meshrl network up` turns it on in a public pool).
A file is usable up to step `v + async_level`, so a member far away, whose files take many
steps from its work order to the trainer, makes stale files from a version a nearby member
could still use. The pool measures each node's lag: for every file of it the trainer takes
(the `taken_through` of `POST /step`), the pool steps between the work order that wanted it
and the take. A node with `MIN_LAGS` measured lags of the last `turnaround_window_s` is wanted
a file only when its version plus the pool's slack covers the pool's step plus its 90th
percentile lag; otherwise it is told why (a newer version helps: `must_fetch`; its newest
does not: its lag is more than the pool's slack). A node not measured yet (new, or whose
lags are older than the window) is wanted files as before, so a node refused once is measured
again after the window: a passing hiccup does not keep it out for good. The lags are the
node's own: nothing another member does changes them but the pool's pace, which is every
member's.

The demand lives in the state's meta table: a restarted orchestrator keeps pacing (the lags
are measured again).
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple

from meshrl.orchestrator.state import PoolStep, State

__all__ = ["Demand", "Pacer", "Want"]

DEMAND = "trainer_demand"  # meta key
MIN_LAGS = 3  # measured lags before a node's orders are sized by them
LAGS_KEPT = 16  # per node, the newest
TRACKED = 4096  # granted files whose order step is remembered until the trainer takes them


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
                 unsubmitted_penalty_s: float = 600.0, turnaround: bool = False,
                 turnaround_window_s: float = 120.0) -> None:
        self.state, self.pool, self.lease_s = state, pool, lease_s
        self.files_per_step = files_per_step
        self.submit_s, self.penalty_s = submit_s, unsubmitted_penalty_s
        raw = state.get_meta(DEMAND)
        self.demand: Demand | None = Demand(**json.loads(raw)) if raw else None
        self.leases: dict[str, float] = {}  # node (lower case) -> lease expiry (monotonic)
        # node (lower case) -> until when it may take no lease (its last one ran out unused)
        self.cooling: dict[str, float] = {}
        self.asked: dict[str, float] = {}  # node as it asked -> when it last asked (monotonic)
        # turnaround (module docstring): node -> the pool's step at its last order that wanted
        # a file; granted file -> (node, that step); node -> (when measured, lag in steps)
        self.turnaround, self.window_s = turnaround, turnaround_window_s
        self.ordered: dict[str, int] = {}
        self.in_flight: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.lags: dict[str, deque[tuple[float, int]]] = {}

    def set_demand(self, taken_through: int | None, ahead: int | None,
                   moved: bool = False) -> None:
        """The trainer's latest word (`ahead` None: stop pacing), `moved`: with a move of the
        pool's step. `taken_through` never goes back (a resumed trainer may re-take files it
        lost; the pool made them already)."""
        if ahead is None:
            self.demand = None
            self.state.set_meta(DEMAND, "")
            return
        before = self.demand.taken_through if self.demand else 0
        self.demand = Demand(max(before, taken_through or 0), ahead)
        self.state.set_meta(DEMAND, json.dumps(self.demand.__dict__))
        self._taken(before, self.demand.taken_through, moved)

    def _taken(self, before: int, through: int, moved: bool) -> None:
        """The trainer took the accepted files numbered (`before`, `through`]: each one whose
        order is known gives its node a lag. A move's restatement speaks of files taken for
        the step before it (most of them), a restatement within a step of that step."""
        if through <= before or not self.in_flight:
            return
        step = self.pool.step - 1 if moved else self.pool.step
        now = time.monotonic()
        for row in self.state.accepted(before, min(through - before, TRACKED)):
            known = self.in_flight.pop(row.sha256, None)
            if known is not None:
                node, ordered = known
                lags = self.lags.setdefault(node, deque(maxlen=LAGS_KEPT))
                lags.append((now, max(0, step - ordered)))

    def granted(self, node: str, sha256: str = "") -> None:
        """`node`'s file was granted a slot: it is in the backlog now, so the lease that held
        its place is given back (counted twice until the node's next work order, it kept
        others waiting while the file was uploaded and submitted); a node that makes files
        is not cooling down. The file's order step is kept until the trainer takes it."""
        key = node.lower()
        self.leases.pop(key, None)
        self.cooling.pop(key, None)
        if self.turnaround and sha256 and key in self.ordered:
            self.in_flight[sha256] = (key, self.ordered[key])
            while len(self.in_flight) > TRACKED:  # a file never taken is forgotten
                self.in_flight.popitem(last=False)
        self.state.alarm.ring()

    def lag(self, node: str, now: float) -> int | None:
        """`node`'s 90th percentile lag (steps from order to take) of the last `window_s`;
        None while fewer than `MIN_LAGS` are measured."""
        lags = self.lags.get(node.lower())
        recent = sorted(lag for t, lag in lags or () if t > now - self.window_s)
        if len(recent) < MIN_LAGS:
            return None
        return recent[math.ceil(0.9 * len(recent)) - 1]

    def too_late(self, node: str, now: float) -> Want | None:
        """A refusal when `node`'s file of the version it holds would reach the trainer after
        the last step that takes it, by its measured lag (None: it would not, or its lag is
        not known)."""
        lag = self.lag(node, now) if self.turnaround else None
        if lag is None:
            return None
        row = self.state.node(node)
        version = -1 if row is None else row.policy_version
        step, slack = self.pool.step, self.pool.async_level
        if step + lag <= version + slack:
            return None
        if version < step:
            return Want(0, f"this node's files reach the trainer {lag} steps after their work "
                           f"order (90th percentile of its last ones): one of version {version} "
                           f"made now would arrive after step {version + slack}, the last that "
                           "takes it; fetch a newer one", must_fetch=True)
        return Want(0, f"this node's files reach the trainer {lag} steps after their work order "
                       f"(90th percentile of its last ones), more than the pool's slack of "
                       f"{slack} versions: none of its files would be used; it is measured "
                       f"again once its lags are {self.window_s:g} s old")

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
        late = self.too_late(node, now)
        if late is not None:
            return late
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
            self.ordered[key] = self.pool.step
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
