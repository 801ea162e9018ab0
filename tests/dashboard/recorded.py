"""A recorded network run for the dashboard's tests: what the roles of a run with three
workers (one a cheater), a member that joined from another host (the stranger) and two
validators (the second rogue) wrote and served, at the trainer's warm start and during RL.

The files are written in the roles' formats (the trainer's `metrics.jsonl`, the role logs'
JSON lines, `network.json`); the orchestrator's answers are its own wire models. `Orchestrator`
serves them over real HTTP on loopback, so the real dashboard process reads them as it reads a
running network (`/nodes`, `/ledger`, `/health`)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from meshrl.wire.models import FileStatus, LedgerEntry, LedgerPage, NodeState, PoolNode, PoolNodes

KEY = "0x" + "11" * 32  # the trainer's reader key (the recorded orchestrator checks nothing)
W0, W1, CHEAT = ("0x" + c * 40 for c in ("a", "b", "c"))
STRANGER = "0x5742616e676572000000000000000000000000d1"
V0, V1 = "0x" + "e0" * 20, "0x" + "e1" * 20
TOKEN = 10**18


def info(root: Path, orchestrator: str) -> dict[str, Any]:
    return {"pool_id": 7, "orchestrator": orchestrator, "trainer_key_file": str(root / "key"),
            "relays": [], "origin": "http://127.0.0.1:9", "trainer_dir": str(root / "trainer"),
            "workers": {"worker-0": {"node": W0, "provider": "0x" + "a1" * 20,
                                     "dishonest": False},
                        "worker-1": {"node": W1, "provider": "0x" + "b1" * 20,
                                     "dishonest": False},
                        "cheater-0": {"node": CHEAT, "provider": "0x" + "c1" * 20,
                                      "dishonest": True}},
            "validator": V0,
            "validators": {"validator": {"address": V0, "rogue": False},
                           "validator-1": {"address": V1, "rogue": True}}}


def _lines(path: Path, records: list[dict[str, Any]], mode: str = "w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


WARM_METRICS = [
    {"kind": "eval", "phase": "sft", "step": 0, "elapsed": 2.0, "accuracy": 0.02},
    *({"kind": k, "phase": "sft", "step": s, "elapsed": 2.0 + 3 * s, "accuracy": a,
       "loss": 2.0 - s / 40, "max_steps": 400, "target": 0.3}
      for s, a in ((10, 0.06), (20, 0.1), (30, 0.17), (40, 0.22)) for k in ("eval", "sft")),
]

RL_METRICS = [
    {"kind": "eval", "phase": "sft", "step": 50, "elapsed": 152.0, "accuracy": 0.31},
    {"kind": "sft", "step": 50, "elapsed": 152.0, "accuracy": 0.31, "loss": 0.7,
     "max_steps": 400, "target": 0.3},
    {"kind": "warm_start", "steps": 50.0, "accuracy": 0.31, "loss": 0.7, "elapsed": 153.0},
    {"kind": "eval", "phase": "rl", "step": 0, "elapsed": 155.0, "accuracy": 0.31},
    *({"kind": "step", "step": s, "version": s - 1, "reward": 0.3 + 0.04 * s,
       "elapsed": 160.0 + 10 * s, "idle_share": 0.2, "validator_lag": 2, "dropped_stale": 0}
      for s in range(1, 13)),
    {"kind": "eval", "phase": "rl", "step": 6, "elapsed": 221.0, "accuracy": 0.58},
    {"kind": "eval", "phase": "rl", "step": 12, "elapsed": 281.0, "accuracy": 0.84},
]


def _node(address: str, version: int, stake: int = 100) -> PoolNode:
    return PoolNode(address=address, provider="0x" + "99" * 20, state=NodeState.HEALTHY,
                    last_seen=time.time(), policy_version=version, step=max(version, 0),
                    tokens_per_s=55.5, files_pending=0, stake=stake * TOKEN,
                    rewards_earned=3 * TOKEN if version >= 0 else 0)


def _entry(seq: int, node: str, status: FileStatus, work_id: int) -> LedgerEntry:
    return LedgerEntry(seq=seq, sha256=f"{seq:064x}", node=node, provider="0x" + "99" * 20,
                       policy_version=seq // 4, work_units=100, size=1000,
                       counter=seq % 4, status=status, work_id=f"{work_id:064x}",
                       uploaded=True, accepted_seq=seq if status is FileStatus.ACCEPTED else 0)


def warm_orchestrator() -> tuple[list[PoolNode], list[LedgerEntry]]:
    """At the warm start: every member joined, none holds a policy (-1), no file yet."""
    return [_node(a, -1) for a in (W0, W1, CHEAT, STRANGER)], []


def rl_orchestrator() -> tuple[list[PoolNode], list[LedgerEntry]]:
    """During RL: the stranger made 3 accepted files and has 2 awaiting a verdict (work ids
    4 and 6: both the first validator's share, of two); the cheater one hard-invalidated."""
    A, S, H = FileStatus.ACCEPTED, FileStatus.SUBMITTED, FileStatus.HARD_INVALIDATED
    ledger = [_entry(1, W0, A, 1), _entry(2, STRANGER, A, 3), _entry(3, CHEAT, H, 5),
              _entry(4, STRANGER, A, 7), _entry(5, W1, A, 9), _entry(6, STRANGER, A, 11),
              _entry(7, STRANGER, S, 4), _entry(8, STRANGER, S, 6), _entry(9, W1, S, 13)]
    return [_node(a, 11) for a in (W0, W1, CHEAT, STRANGER)], ledger


def validator_logs(root: Path, now: float) -> None:
    """validator judged 4 files (one twice: logged again after a restart) and accused the
    cheater's; the rogue validator-1 judged 2, accused both, and one accusation (of the
    stranger's honest file) was overturned when validator settled it."""
    v0 = [{"ts": now - 30, "msg": "verdict", "sha256": f"{1:064x}", "node": W0,
           "verdict": "accept", "reason": "ok"},
          {"ts": now - 25, "msg": "verdict", "sha256": f"{3:064x}", "node": CHEAT,
           "verdict": "hard_invalid", "reason": "rewards: 3 of 8 rows wrong"},
          {"ts": now - 24, "msg": "verdict on chain", "work_id": f"{5:064x}",
           "action": "accuse_hard", "tx": "0x01"},
          {"ts": now - 20, "msg": "verdict", "sha256": f"{5:064x}", "node": W1,
           "verdict": "accept", "reason": "ok"},
          {"ts": now - 20, "msg": "verdict", "sha256": f"{5:064x}", "node": W1,
           "verdict": "accept", "reason": "ok"},
          {"ts": now - 15, "msg": "verdict", "sha256": f"{2:064x}", "node": STRANGER,
           "verdict": "accept", "reason": "ok"},
          {"ts": now - 14, "msg": "verdict on chain", "work_id": f"{3:064x}",
           "action": "overturn", "tx": "0x02"},
          {"ts": now - 4, "msg": "verdict settled", "work_id": f"{3:064x}", "tx": "0x03",
           "overturned": True},
          {"ts": now - 3, "msg": "verdict settled", "work_id": f"{5:064x}", "tx": "0x04",
           "overturned": False}]
    v1 = [{"ts": now - 16, "msg": "verdict", "sha256": f"{2:064x}", "node": STRANGER,
           "verdict": "hard_invalid", "reason": "rogue: accuse-honest"},
          {"ts": now - 16, "msg": "verdict on chain", "work_id": f"{3:064x}",
           "action": "accuse_hard", "tx": "0x05"},
          {"ts": now - 10, "msg": "verdict", "sha256": f"{3:064x}", "node": CHEAT,
           "verdict": "hard_invalid", "reason": "rewards: 3 of 8 rows wrong"},
          {"ts": now - 10, "msg": "verdict on chain", "work_id": f"{5:064x}",
           "action": "uphold", "tx": "0x06"}]
    _lines(root / "logs" / "validator.log", v0)
    _lines(root / "logs" / "validator-1.log", v1)


def write_warm(root: Path, orchestrator: str, now: float) -> dict[str, Any]:
    """The run directory at the warm start (step 40 of 400, held-out accuracy 0.22), with the
    pool's wait line of that moment."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "key").write_text(KEY)
    net = info(root, orchestrator)
    (root / "network.json").write_text(json.dumps(net))
    _lines(root / "trainer" / "metrics.jsonl", WARM_METRICS)
    _lines(root / "logs" / "orchestrator.log",
           [{"ts": now - 1, "msg": "pool step waiting", "step": 0, "members": 4,
             "why": "members are generating"}])
    _lines(root / "events.jsonl", [{"t": now - 200, "role": "trainer", "event": "start"}])
    return net


def write_rl(root: Path, now: float) -> None:
    """What the roles add from the warm start to RL step 12."""
    _lines(root / "trainer" / "metrics.jsonl", RL_METRICS, "a")
    validator_logs(root, now)


class Orchestrator:
    """The recorded orchestrator's answers (`nodes`, `ledger`), served on loopback from a
    thread of the test process; the test swaps them as the run moves on."""

    def __init__(self) -> None:
        self.nodes, self.ledger = warm_orchestrator()
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/nodes", self._nodes)
        app.router.add_get("/ledger", self._ledger)
        app.router.add_get("/health", self._health)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def _nodes(self, _: web.Request) -> web.Response:
        return web.json_response(text=PoolNodes(nodes=self.nodes).model_dump_json())

    async def _ledger(self, r: web.Request) -> web.Response:
        after, limit = int(r.query.get("after", 0)), int(r.query.get("limit", 500))
        page = [e for e in self.ledger if e.seq > after][:limit]
        return web.json_response(text=LedgerPage(
            entries=page, next_after=page[-1].seq if page else after).model_dump_json())

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "info": {"pacing": {
            "ahead": 8, "taken_through": 0, "backlog": 3, "leases": 1}}})

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
