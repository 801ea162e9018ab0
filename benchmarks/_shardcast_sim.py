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
import random
from dataclasses import dataclass, field

__all__ = ["SimResult", "build_topology", "simulate", "simulate_relays"]


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


def simulate_relays(
    workers: int,
    relays: int,
    size: float,
    shards: int,
    upload: float,
    concurrency: int = 4,
    relay_concurrency: int = 2,
    origin_weight: float = 0.25,
    serve_clients: str = "spare",
    seed: int = 0,
) -> SimResult:
    """The deployed shape: `relays` relays mirror the origin; every worker may fetch any shard
    from any server that holds it (as `ShardcastClient` with all URLs does).

    Each node has upload `upload` (downloads unlimited, as on loopback). The origin's upload
    goes to relays first (strict priority, `ShardServer`'s token bucket); with `serve_clients`
    "spare" a worker starts a transfer at the origin only while no relay transfer runs there,
    with "never" not at all. Receivers request shards in their own random order (seeded), up to
    `relay_concurrency` (relays) or `concurrency` (workers) at once; a worker asks the server
    with the best expected share, biased by `origin_weight` against the origin.
    """
    if serve_clients not in ("always", "spare", "never"):
        raise ValueError(f"unknown serve_clients {serve_clients!r}")
    if relays == 0 and serve_clients == "never":
        raise ValueError("nobody serves the workers")
    rng = random.Random(seed)
    n = 1 + relays + workers
    held = [set(range(shards))] + [set() for _ in range(n - 1)]
    orders = [[]] + [rng.sample(range(shards), shards) for _ in range(n - 1)]
    fetching: list[set[int]] = [set() for _ in range(n)]
    done_at = [0.0] * n
    shard_bytes = size / shards
    active: list[list] = []  # [remaining bytes, src, dst, shard, high]

    def load(src: int) -> int:
        return sum(1 for a in active if a[1] == src)

    def source(dst: int, shard: int) -> int | None:
        spare = serve_clients == "always" or (
            serve_clients == "spare" and not any(a[1] == 0 and a[4] for a in active))
        best, score = None, 0.0
        for src in range(relays + 1):
            if shard not in held[src] or (src == 0 and not spare):
                continue
            own = sum(1 for a in active if a[1] == src and a[2] == dst)
            s = (origin_weight if src == 0 else 1.0) * upload / (load(src) + 1) / (1 + own)
            if s > score:
                best, score = src, s
        return best

    def schedule() -> None:
        for dst in range(1, n):
            relay = dst <= relays
            limit = relay_concurrency if relay else concurrency
            for shard in orders[dst]:
                if len(fetching[dst]) >= limit:
                    break
                if shard in held[dst] or shard in fetching[dst]:
                    continue
                src = 0 if relay else source(dst, shard)
                if src is not None:
                    fetching[dst].add(shard)
                    active.append([shard_bytes, src, dst, shard, relay])

    t, transfers = 0.0, 0
    schedule()
    while active:
        rates = _priority_rates(active, upload)
        dt = min(a[0] / r for a, r in zip(active, rates, strict=True) if r > 0)
        t += dt
        still = []
        for a, r in zip(active, rates, strict=True):
            a[0] -= r * dt
            if a[0] > shard_bytes * 1e-9:
                still.append(a)
                continue
            fetching[a[2]].discard(a[3])
            held[a[2]].add(a[3])
            transfers += 1
            if len(held[a[2]]) == shards:
                done_at[a[2]] = t
        active[:] = still
        schedule()
    done = done_at[relays + 1 :]
    if any(len(h) < shards for h in held):
        raise ValueError("some workers could not be served")
    return SimResult("relays", workers, relays, max(done), sum(done) / len(done), transfers)


def _priority_rates(active: list[list], upload: float) -> list[float]:
    """Each server's upload split evenly over its relay transfers, else over its others."""
    high: dict[int, int] = {}
    low: dict[int, int] = {}
    for a in active:
        (high if a[4] else low)[a[1]] = (high if a[4] else low).get(a[1], 0) + 1
    return [upload / high[a[1]] if a[4] else (0.0 if a[1] in high else upload / low[a[1]])
            for a in active]
