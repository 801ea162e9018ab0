"""How fast the orchestrator's chain follower applies a burst of events, without and with the
per-node money books (`orchestrator.books`). On a local anvil: a pool with `--nodes` nodes of
two providers, then `--subs` work submissions (one block each, as anvil mines them); a fresh
follower state then applies every event from the deployment block in one `follow()`. Prints
one JSON line per run; modes alternate, `--repeat` times each, in this one process.

Usage: python benchmarks/bench_follow.py [--nodes 20] [--subs 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eth_account import Account
from eth_utils import keccak

from meshrl.orchestrator.chainview import ChainView
from meshrl.orchestrator.state import State
from meshrl.protocol import Protocol, ProtocolParams, deploy
from meshrl.protocol.anvil import AnvilNode

TOKEN = 10**18
PARAMS = ProtocolParams(min_stake=100 * TOKEN, stake_per_unit=TOKEN, invalidation_window=3600,
                        lock_period=7200, slash_penalty=50 * TOKEN)


def acct(label: str):
    return Account.from_key(keccak(text=f"bench-follow-{label}"))


def build(backend, nodes: int, subs: int) -> tuple[Protocol, int]:
    fed, mgr = acct("fed"), acct("mgr")
    provs = [acct("p0"), acct("p1")]
    members = [acct(f"n{i}") for i in range(nodes)]
    for a in (fed, mgr, *provs, *members):
        backend.fund(a.address, 10**21)
    dep = deploy(backend, fed, PARAMS)
    F = Protocol(backend, dep, fed)
    pool = F.create_pool(F.create_domain("math"), mgr.address, 10**15)
    F.start_pool(pool)
    M = F.as_(mgr)
    for i, p in enumerate(provs):
        F.mint(p.address, 10_000 * TOKEN)
        F.as_(p).register_provider(1000 * TOKEN)
        for n in members[i::2]:
            F.as_(p).add_node(n, 1)
            expiry = backend.now() + 3600
            F.as_(p).join_pool(pool, n.address, 1, expiry,
                               M.sign_invite(pool, n.address, 1, expiry))
    for k in range(subs):
        n = members[k % nodes]
        F.as_(provs[k % nodes % 2]).submit_work(pool, n.address, keccak(text=f"f{k}"), 3)
    return M, pool


async def once(M: Protocol, pool: int, books: bool, tmp: Path) -> dict:
    state = State(tmp / f"s{time.monotonic_ns()}.db")
    chain = ChainView(M, pool, 0.0)
    if books:
        await chain.open_books(state)
    t = time.perf_counter()
    n = await chain.follow(state)
    dt = time.perf_counter() - t
    chain.close()
    state.close()
    return {"books": books, "events": n, "s": round(dt, 3), "events_per_s": round(n / dt, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--subs", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    node = AnvilNode()
    backend = node.start()
    try:
        M, pool = build(backend, args.nodes, args.subs)
        runs: dict[bool, list[float]] = {False: [], True: []}
        with tempfile.TemporaryDirectory() as d:
            for _ in range(args.repeat):
                for books in (False, True):
                    r = asyncio.run(once(M, pool, books, Path(d)))
                    runs[books].append(r["events_per_s"])
                    print(json.dumps({"bench": "follow", **r}), flush=True)
        before, after = statistics.median(runs[False]), statistics.median(runs[True])
        print(json.dumps({"bench": "follow", "median_events_per_s_before": before,
                          "median_events_per_s_after": after,
                          "after_over_before": round(after / before, 3)}))
    finally:
        node.stop()


if __name__ == "__main__":
    main()
