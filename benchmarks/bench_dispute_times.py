"""Dispute latencies of a finished or running network: for each verdict of its pool, the
seconds (block times) from the accusation to each vote and to the settlement, and the outcome.
One JSON object per line. `python benchmarks/bench_dispute_times.py runs/network`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from meshrl.network.keys import dev_account
from meshrl.protocol import Deployment, Protocol
from meshrl.protocol.backend import RpcBackend
from meshrl.protocol.history import pool_disputes


def main(run: str) -> None:
    info = json.loads((Path(run) / "network.json").read_text())
    chain = Protocol(RpcBackend(info["rpc_url"]), Deployment.load(info["deployment"]),
                     dev_account(0))
    votes: dict[str, list[int]] = {}
    for e in chain.events().poll():
        if e.name == "VerdictVoted":
            ts = int(chain.backend.w3.eth.get_block(e.block)["timestamp"])
            votes.setdefault(bytes(e.args["work_id"]).hex(), []).append(ts)
    for d in pool_disputes(chain, info["pool_id"]):
        print(json.dumps({
            "work_id": d["work_id"], "validator": d["validator"], "node": d["node"],
            "outcome": d["outcome"], "challenged": d["challenged"],
            "vote_after_s": [t - d["ts"] for t in votes.get(d["work_id"], [])],
            "settled_after_s": None if d["settled_ts"] is None else d["settled_ts"] - d["ts"],
            "forfeited": d["forfeited"], "slashed": d["slashed"]}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/network")
