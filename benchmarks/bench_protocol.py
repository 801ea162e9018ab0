"""Gas per protocol operation and transaction latency, on the in-process chain (eth-tester)
and on a local anvil node. Prints one JSON object per line:

    {"bench": "protocol", "backend": "anvil", "op": "submit_work", "gas": 123456,
     "latency_ms_median": 4.1, "latency_ms_min": 3.9, "n": 5}

Each measured operation starts from the same chain state (snapshot / revert), so its gas is
exact and repeatable; latency is wall time from building the transaction to its receipt
(sign, estimate gas, send, mine, receipt). Usage: python benchmarks/bench_protocol.py [--n 5]
[--batches_only] [--backend eth-tester|anvil|both]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eth_account import Account
from eth_utils import keccak

from meshrl.protocol import EthTesterBackend, Protocol, ProtocolParams, Receipt, deploy
from meshrl.protocol.anvil import AnvilNode, find_anvil

TOKEN = 10**18


def acct(label: str):
    return Account.from_key(keccak(text=f"bench-{label}"))


def measure(backend, op: str, action: Callable[[], Receipt], n: int, setup=None) -> dict:
    gas, times = set(), []
    for _ in range(n):
        snap = backend.snapshot()
        if setup is not None:
            setup()
        t = time.perf_counter()
        receipt = action()
        times.append((time.perf_counter() - t) * 1000)
        gas.add(receipt.gas_used)
        backend.revert(snap)
    return {
        "op": op,
        "gas": max(gas),
        "latency_ms_median": round(statistics.median(times), 2),
        "latency_ms_min": round(min(times), 2),
        "n": n,
    }


def run(backend, name: str, n: int) -> None:
    fed, mgr, val, val2, prov, node, node2 = (
        acct(x) for x in ("fed", "mgr", "val", "val2", "p", "n", "n2"))
    for a in (fed, mgr, val, val2, prov, node, node2):
        backend.fund(a.address, 10**21)
    params = ProtocolParams()
    t = time.perf_counter()
    dep = deploy(backend, fed, params)
    emit(
        name,
        {
            "op": "deploy_all",
            "latency_ms_median": round((time.perf_counter() - t) * 1000, 2),
            "n": 1,
        },
    )
    F = Protocol(backend, dep, fed)
    P, M, V, V2 = F.as_(prov), F.as_(mgr), F.as_(val), F.as_(val2)
    F.mint(prov.address, 10**6 * TOKEN)
    for v in (val, val2):
        F.mint(v.address, 10**4 * TOKEN)
        F.set_validator(v.address)
    results_bond = measure(backend, "post_bond", lambda: V.post_bond(1000 * TOKEN), n)
    for v in (V, V2):
        v.post_bond(1000 * TOKEN)
    domain = F.create_domain("bench")
    pool = F.create_pool(domain, mgr.address, 10**15)
    F.start_pool(pool)

    results = [
        results_bond,
        measure(backend, "mint", lambda: F.mint(prov.address, TOKEN), n),
        measure(backend, "approve", lambda: P.approve(dep.protocol, TOKEN), n),
        measure(
            backend, "create_domain", lambda: F._send(F.contract.functions.create_domain("x")), n
        ),
        measure(
            backend,
            "create_pool",
            lambda: F._send(F.contract.functions.create_pool(domain, mgr.address, 1, 10**6)),
            n,
        ),
        measure(
            backend,
            "register_provider",
            lambda: P.register_provider(1000 * TOKEN, False),
            n,
            setup=lambda: P.approve(dep.protocol, 10**9 * TOKEN),
        ),
    ]
    P.register_provider(1000 * TOKEN)
    results.append(
        measure(
            backend,
            "add_stake",
            lambda: P.add_stake(TOKEN, False),
            n,
            setup=lambda: P.approve(dep.protocol, TOKEN),
        )
    )
    results.append(measure(backend, "add_node", lambda: P.add_node(node2, 4), n))
    P.add_node(node, 8)
    expiry = backend.now() + 3600  # invites live at most a day
    results.append(
        measure(
            backend,
            "join_pool",
            lambda: P.join_pool(
                pool, node.address, 1, expiry, M.sign_invite(pool, node.address, 1, expiry)
            ),
            n,
        )
    )
    P.join_pool(pool, node.address, 2, expiry, M.sign_invite(pool, node.address, 2, expiry))
    f0 = keccak(text="file-0")
    results.append(
        measure(backend, "submit_work", lambda: P.submit_work(pool, node.address, f0, 100), n)
    )
    results.append(
        measure(
            backend,
            "submit_work_with_interval",  # a pool with min_interval: one more slot per node
            lambda: P.submit_work(pool, node.address, f0, 100),
            n,
            setup=lambda: M.set_pool_limits(pool, 10**6, 60),
        )
    )
    files = [P.work_id(node.address, keccak(text=f"file-{i}")) for i in range(1, 11)]
    for i in range(1, 11):
        P.submit_work(pool, node.address, keccak(text=f"file-{i}"), 100)
    # verdicts final at once (dispute_period 0, only at deployment since issue 42)
    results += _final_at_once(backend, n)
    # disputable verdicts (the default): accuse, challenge, vote, settle
    results.append(measure(backend, "soft_invalidate", lambda: V.soft_invalidate(files[0]), n))
    results.append(measure(backend, "hard_invalidate", lambda: V.hard_invalidate(files[0]), n))

    def accused(challenge: bool = False, vote: bool | None = None, rule: bool = False):
        def setup():
            V.hard_invalidate(files[1])
            if challenge:
                P.challenge(files[1])
            if vote is not None:
                V2.vote(files[1], vote)
            if rule:
                F.rule(files[1], True)
            # an unconfirmed verdict stays open 24 periods (issue 42)
            backend.advance_time(24 * params.dispute_period + params.vote_period)
        return setup

    results.append(measure(backend, "challenge", lambda: P.challenge(files[1]), n,
                           setup=lambda: V.hard_invalidate(files[1])))
    results.append(measure(backend, "vote", lambda: V2.vote(files[1], True), n,
                           setup=lambda: V.hard_invalidate(files[1])))
    results.append(measure(backend, "vote_overturn", lambda: V2.vote(files[1], False), n,
                           setup=lambda: V.hard_invalidate(files[1])))
    results.append(measure(backend, "rule", lambda: F.rule(files[1], True), n,
                           setup=lambda: (V.hard_invalidate(files[1]), P.challenge(files[1]))))
    results.append(measure(backend, "hard_invalidate_over_soft",
                           lambda: V2.hard_invalidate(files[1]), n,
                           setup=lambda: V.soft_invalidate(files[1])))
    results.append(measure(backend, "settle_upheld", lambda: F.settle(files[1]), n,
                           setup=accused()))
    results.append(measure(backend, "settle_upheld_confirmed", lambda: F.settle(files[1]), n,
                           setup=accused(vote=True)))
    results.append(measure(backend, "settle_upheld_challenged_ruled",
                           lambda: F.settle(files[1]), n,
                           setup=accused(True, False, rule=True)))
    results.append(measure(backend, "settle_overturned", lambda: F.settle(files[1]), n,
                           setup=accused(True, False)))
    results.append(measure(backend, "slash", lambda: F.slash(prov.address, TOKEN), n))
    results.append(measure(backend, "leave_pool", lambda: P.leave_pool(node.address), n))
    backend.advance_time(params.lock_period + 1)
    results.append(measure(backend, "claim_1", lambda: P.claim(files[:1]), n))
    results.append(measure(backend, "claim_10", lambda: P.claim(files), n))
    results.append(measure(backend, "request_unstake", lambda: P.request_unstake(TOKEN), n))
    P.request_unstake(TOKEN)
    backend.advance_time(params.unbonding_delay + 1)
    results.append(measure(backend, "withdraw", P.withdraw, n))
    for r in results:
        emit(name, r)
    views = []
    for _ in range(max(n, 5)):
        t = time.perf_counter()
        F.pool(pool)
        views.append((time.perf_counter() - t) * 1000)
    emit(
        name,
        {
            "op": "view_call",
            "latency_ms_median": round(statistics.median(views), 2),
            "n": len(views),
        },
    )
    cursor = F.events()
    t = time.perf_counter()
    events = cursor.poll()
    emit(
        name,
        {
            "op": "events_poll_all",
            "events": len(events),
            "latency_ms_median": round((time.perf_counter() - t) * 1000, 2),
            "n": 1,
        },
    )


def _final_at_once(backend, n: int) -> list[dict]:
    """soft / hard verdicts on a deployment whose verdicts are final at once."""
    fed, mgr, val, prov, node = (acct(f"final-{x}") for x in ("fed", "mgr", "val", "p", "n"))
    for a in (fed, mgr, val, prov, node):
        backend.fund(a.address, 10**21)
    params = ProtocolParams(dispute_period=0)
    F = Protocol(backend, deploy(backend, fed, params), fed)
    P, M, V = F.as_(prov), F.as_(mgr), F.as_(val)
    F.mint(prov.address, 10**6 * TOKEN)
    F.mint(val.address, 10**4 * TOKEN)
    F.set_validator(val.address)
    V.post_bond(1000 * TOKEN)
    pool = F.create_pool(F.create_domain("final"), mgr.address, 10**15)
    F.start_pool(pool)
    P.register_provider(1000 * TOKEN)
    P.add_node(node, 8)
    expiry = backend.now() + 3600
    P.join_pool(pool, node.address, 1, expiry, M.sign_invite(pool, node.address, 1, expiry))
    f = keccak(text="final-file")
    P.submit_work(pool, node.address, f, 100)
    wid = P.work_id(node.address, f)
    return [measure(backend, "soft_invalidate_final", lambda: V.soft_invalidate(wid), n),
            measure(backend, "hard_invalidate_final", lambda: V.hard_invalidate(wid), n)]


BATCH_SIZES = (1, 16, 64, 256)


def run_batches(backend, name: str, n: int) -> None:
    """Gas per file of batched work (issue 46) at each batch size: submit, a verdict on one
    leaf (open + accuse; accepting costs nothing on chain), a dispute on it (vote + settle),
    and the claim; `amortized_submit_claim` is (submit + claim) / files."""
    fed, mgr, val, val2, prov, node = (acct(f"batch-{x}")
                                       for x in ("fed", "mgr", "val", "val2", "p", "n"))
    for a in (fed, mgr, val, val2, prov, node):
        backend.fund(a.address, 10**21)
    params = ProtocolParams()
    F = Protocol(backend, deploy(backend, fed, params), fed)
    P, M, V, V2 = F.as_(prov), F.as_(mgr), F.as_(val), F.as_(val2)
    F.mint(prov.address, 10**6 * TOKEN)
    for v in (val, val2):
        F.mint(v.address, 10**4 * TOKEN)
        F.set_validator(v.address)
        F.as_(v).post_bond(1000 * TOKEN)
    pool = F.create_pool(F.create_domain("batches"), mgr.address, 10**15)
    F.start_pool(pool)
    P.register_provider(1000 * TOKEN)
    P.add_node(node, 8)
    expiry = backend.now() + 3600
    P.join_pool(pool, node.address, 1, expiry, M.sign_invite(pool, node.address, 1, expiry))
    for size in BATCH_SIZES:
        _one_batch_size(backend, name, n, size, params, pool, node.address, F, P, V, V2)


def _one_batch_size(backend, name, n, size, params, pool, node, F, P, V, V2) -> None:
    from meshrl.protocol.batches import Batch, Leaf

    leaves = [Leaf(node, keccak(text=f"batch-{size}-{i}"), 100, step=1, counter=i)
              for i in range(size)]
    batch = Batch.of(leaves)
    submit = measure(backend, "submit_batch",
                     lambda: P.submit_batch(pool, node, batch.root, batch.count, batch.units), n)
    P.submit_batch(pool, node, batch.root, batch.count, batch.units)
    last = size - 1  # the deepest proof
    wid = leaves[last].work_id
    verdict = measure(backend, "leaf_hard_verdict", lambda: V.accuse_leaf(batch, last, True), n)

    def accused() -> None:
        V.accuse_leaf(batch, last, True)
        V2.vote(wid, True)
        backend.advance_time(params.dispute_period + 1)

    dispute = measure(backend, "leaf_settle_upheld_confirmed", lambda: F.settle(wid), n,
                      setup=accused)
    vote = measure(backend, "leaf_vote", lambda: V2.vote(wid, True), n,
                   setup=lambda: V.accuse_leaf(batch, last, True))
    snap = backend.snapshot()
    backend.advance_time(params.lock_period + 1)
    claim = measure(backend, "claim_batch", lambda: P.claim_batch([batch.id]), n)
    backend.revert(snap)
    for r in (submit, verdict, vote, dispute, claim):
        emit(name, {**r, "batch": size, "gas_per_file": round(r["gas"] / size)})
    emit(name, {"op": "amortized_submit_claim", "batch": size,
                "gas_per_file": round((submit["gas"] + claim["gas"]) / size)})


def emit(backend: str, row: dict) -> None:
    print(json.dumps({"bench": "protocol", "backend": backend, **row}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="repetitions per operation")
    ap.add_argument("--batches_only", action="store_true",
                    help="only the batched-work gas")
    ap.add_argument("--backend", choices=("eth-tester", "anvil", "both"), default="both",
                    help="the chain(s) measured (anvil: node_modules/.bin/anvil, then PATH)")
    args = ap.parse_args()
    if args.backend in ("eth-tester", "both"):
        if not args.batches_only:
            run(EthTesterBackend(), "eth-tester", args.n)
        run_batches(EthTesterBackend(), "eth-tester", args.n)
    if args.backend == "eth-tester":
        return
    if find_anvil() is None:
        emit("anvil", {"skipped": "anvil not installed (make setup)"})
        return
    with AnvilNode() as backend:
        if not args.batches_only:
            run(backend, "anvil", args.n)
        run_batches(backend, "anvil", args.n)


if __name__ == "__main__":
    main()
