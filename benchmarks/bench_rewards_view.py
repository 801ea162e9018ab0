"""One provider's rewards: `provider_rewards` (its own logs by topic filter, item states in
JSON-RPC batches) against `pool_history` (every item of the pool, 2-3 calls each), on a local
anvil holding a pool of `--providers` providers with `--works` work items each, directly and
through a link that adds `--delay_ms` each way. Prints one JSON object per measurement."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from eth_account import Account
from eth_utils import keccak

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from linkrelay import Link
from meshrl.protocol import Protocol, ProtocolParams, RpcBackend, deploy
from meshrl.protocol.anvil import AnvilNode, _free_port
from meshrl.protocol.history import pool_history, provider_rewards

TOKEN = 10**18


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--providers", type=int, default=8)
    ap.add_argument("--works", type=int, default=40, help="work items per provider")
    ap.add_argument("--delay_ms", type=float, default=40.0, help="one way (RTT is twice)")
    args = ap.parse_args()
    node = AnvilNode()
    backend = node.start()
    try:
        acct = [Account.from_key(keccak(text=f"bench-rewards-{i}")) for i in range(
            2 + 2 * args.providers)]
        for a in acct:
            backend.fund(a.address, 10**21)
        fed, mgr = acct[0], acct[1]
        dep = deploy(backend, fed, ProtocolParams(min_stake=TOKEN, stake_per_unit=0))
        p = Protocol(backend, dep, fed)
        pool = p.create_pool(p.create_domain("d"), mgr.address, 10**15)
        p.start_pool(pool)
        providers = []
        for i in range(args.providers):
            prov, n = acct[2 + 2 * i], acct[3 + 2 * i]
            p.mint(prov.address, 10 * TOKEN)
            me = p.as_(prov)
            me.register_provider(TOKEN)
            me.add_node(n, 1)
            exp = backend.now() + 600
            me.join_pool(pool, n.address, i + 1, exp, p.as_(mgr).sign_invite(pool, n.address,
                                                                            i + 1, exp))
            for j in range(args.works):
                me.submit_work(pool, n.address, keccak(text=f"f-{i}-{j}"), 10)
            providers.append(prov.address)
        port = _free_port()
        link = Link([(("127.0.0.1", port), ("127.0.0.1", node.port))],
                    delay_s=args.delay_ms / 1000).start()
        try:
            for where, url in (("loopback", node.url),
                               (f"rtt_{2 * args.delay_ms:g}ms", f"http://127.0.0.1:{port}")):
                q = Protocol(RpcBackend(url), dep)
                t0 = time.perf_counter()
                mine = provider_rewards(q, pool, providers[0])
                t1 = time.perf_counter()
                full = pool_history(q, pool)
                t2 = time.perf_counter()
                assert mine["nodes"] == {k: v for k, v in full["rewards"].items()
                                         if k in mine["nodes"]}
                print(json.dumps({"bench": "rewards_view", "link": where,
                                  "pool_items": len(full["works"]),
                                  "provider_items": len(mine["works"]),
                                  "provider_rewards_s": round(t1 - t0, 3),
                                  "pool_history_s": round(t2 - t1, 3)}))
        finally:
            link.close()
    finally:
        node.stop()


if __name__ == "__main__":
    main()
