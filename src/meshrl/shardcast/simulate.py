"""Fluid simulation of a shard broadcast when each server's upload bandwidth is limited.

Why: on loopback every server has unbounded bandwidth, so a relay tree cannot show its point.
Here each node has an upload cap `upload` (bytes/s) shared equally by its active transfers and a
download cap `download` shared by its own; a transfer runs at the smaller of its two shares
(processor sharing). Every receiver keeps up to `concurrency` shard transfers going, always
asking its parent for the lowest-numbered shard the parent already holds (relays forward shards
as soon as they have them: pipelining). The simulation is event-driven and exact for this model:
between two completions all rates are constant.

Topologies: `star` (every worker downloads from the origin) and `tree` (relays in a `fanout`-ary
tree under the origin, each leaf relay serving at most `fanout` workers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["SimResult", "build_topology", "simulate"]


@dataclass
class _Node:
    name: str
    parent: int | None
    held: set[int] = field(default_factory=set)
    fetching: set[int] = field(default_factory=set)
    done_at: float = 0.0


@dataclass
class SimResult:
    topology: str
    workers: int
    relays: int
    seconds: float  # until the last worker holds every shard
    worker_mean_seconds: float
    transfers: int


def build_topology(kind: str, workers: int, fanout: int = 4) -> list[tuple[str, int | None]]:
    """(name, parent index) per node; node 0 is the origin, workers come last."""
    nodes: list[tuple[str, int | None]] = [("origin", None)]
    if kind == "star":
        return nodes + [(f"worker{w}", 0) for w in range(workers)]
    if kind != "tree":
        raise ValueError(f"unknown topology {kind!r}")
    if fanout < 2:
        raise ValueError("fanout must be at least 2")
    sizes = [max(1, math.ceil(workers / fanout))]  # relays per level, from the leaves up
    while sizes[-1] > fanout:
        sizes.append(math.ceil(sizes[-1] / fanout))
    parents = [0]
    for size in reversed(sizes):
        level = []
        for j in range(size):
            nodes.append((f"relay{len(nodes) - 1}", parents[j // fanout]))
            level.append(len(nodes) - 1)
        parents = level
    return nodes + [(f"worker{w}", parents[w // fanout]) for w in range(workers)]


def simulate(
    kind: str,
    workers: int,
    size: float,
    shards: int,
    upload: float,
    download: float = math.inf,
    concurrency: int = 4,
    fanout: int = 4,
) -> SimResult:
    """Broadcast `size` bytes in `shards` shards from the origin to `workers` workers."""
    spec = build_topology(kind, workers, fanout)
    nodes = [_Node(name, parent) for name, parent in spec]
    nodes[0].held = set(range(shards))
    shard_bytes = size / shards
    active: list[list] = []  # [remaining bytes, src, dst, shard]
    t, transfers = 0.0, 0

    def schedule() -> None:
        for i, n in enumerate(nodes):
            if n.parent is None or len(n.held) == shards:
                continue
            src = nodes[n.parent]
            while len(n.fetching) < concurrency:
                want = next((s for s in sorted(src.held - n.held - n.fetching)), None)
                if want is None:
                    break
                n.fetching.add(want)
                active.append([shard_bytes, n.parent, i, want])

    schedule()
    while active:
        ups: dict[int, int] = {}
        downs: dict[int, int] = {}
        for _, src, dst, _ in active:
            ups[src] = ups.get(src, 0) + 1
            downs[dst] = downs.get(dst, 0) + 1
        rates = [min(upload / ups[a[1]], download / downs[a[2]]) for a in active]
        dt = min(a[0] / r for a, r in zip(active, rates, strict=True))
        t += dt
        still = []
        for a, r in zip(active, rates, strict=True):
            a[0] -= r * dt
            if a[0] <= shard_bytes * 1e-9:
                dst = nodes[a[2]]
                dst.fetching.discard(a[3])
                dst.held.add(a[3])
                transfers += 1
                if len(dst.held) == shards:
                    dst.done_at = t
            else:
                still.append(a)
        active[:] = still
        schedule()
    done = [n.done_at for n in nodes if n.name.startswith("worker")]
    relays = sum(1 for n in nodes if n.name.startswith("relay"))
    return SimResult(kind, workers, relays, max(done), sum(done) / len(done), transfers)
