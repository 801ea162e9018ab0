"""One JSON snapshot of a running network, from what its roles publish (see the package doc).

Each source that does not answer (a role restarting) leaves its part empty and is named in
`errors`, so the page keeps updating through faults.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp

from meshrl.wire import SignedClient
from meshrl.wire.models import LedgerPage, PoolNodes

__all__ = ["collect_state", "flow_state"]

CURVE_POINTS = 400


def _jsonl(path: Path, keep: Any = None) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if keep is None or keep(rec):
            out.append(rec)
    return out


async def _orchestrator(info: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    key = Path(info["trainer_key_file"]).read_text().strip()
    async with SignedClient(info["orchestrator"], key, timeout_s=5) as c:
        nodes = await c.call("GET", "/nodes", response=PoolNodes)
        entries, after = [], 0
        while True:
            page = await c.call("GET", "/ledger", response=LedgerPage,
                                query={"after": after, "limit": 5000})
            if not page.entries:
                return nodes.nodes, entries
            entries += page.entries
            after = page.next_after


async def _shardcast(urls: list[str]) -> list[dict[str, Any]]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
        for url in urls:
            try:
                async with s.get(url + "/health") as r:
                    h = await r.json()
                out.append({"url": url, "role": h.get("role"), "latest": h.get("latest"),
                            "complete": h.get("complete", [])})
            except (aiohttp.ClientError, TimeoutError, ValueError):
                out.append({"url": url, "role": None, "latest": None, "complete": []})
    return out


async def _pacing(url: str) -> dict[str, Any] | None:
    """The orchestrator's pacing as its `/health` says (None when it does not answer)."""
    try:
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s,
                    s.get(url + "/health") as r):
            return (await r.json()).get("info", {}).get("pacing")
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def _tail(path: Path, msgs: tuple[str, ...], limit: int = 1 << 16) -> dict[str, Any] | None:
    """The last line of `path`'s last `limit` bytes whose `msg` is one of `msgs`."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        if line.startswith("{") and any(m in line for m in msgs):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("msg") in msgs:
                return rec
    return None


# a wait line older than this is over (each is repeated while its wait lasts)
WAIT_FRESH_S = 60.0


def flow_state(run: Path, steps: list[dict[str, Any]], pacing: dict[str, Any] | None,
               now: float) -> dict[str, Any]:
    """Is the trainer kept busy: its idle share and the validator's lag (its metrics' last
    step), the stale drops, the pool's pacing, and why the trainer or the pool waits now (their
    last wait lines, while fresh)."""
    last = steps[-1] if steps else {}
    waits = []
    for role, msgs in (("trainer", ("step waiting for accepted files",
                                    "step waiting for verdicts")),
                       ("orchestrator", ("pool step waiting",))):
        rec = _tail(run / "logs" / f"{role}.log", msgs)
        if rec is not None and now - rec.get("ts", 0) <= WAIT_FRESH_S:
            waits.append({"role": role, "msg": rec["msg"], "why": rec.get("why", ""),
                          "ts": rec.get("ts")})
    return {"idle_share": last.get("idle_share"), "validator_lag": last.get("validator_lag"),
            "dropped_stale": last.get("dropped_stale"), "pacing": pacing, "waiting": waits}


def _nodes(info: dict[str, Any], pool: list[Any], ledger: list[Any]) -> list[dict[str, Any]]:
    by_addr = {n.address.lower(): n for n in pool}
    files: dict[str, Counter[str]] = defaultdict(Counter)
    for e in ledger:
        files[e.node.lower()][e.status.value] += 1
    rows = []
    for name, w in info["workers"].items():
        a = w["node"].lower()
        n = by_addr.get(a)
        f = files[a]
        rows.append({
            "name": name, "node": w["node"], "dishonest": w["dishonest"],
            "state": n.state.value if n else "not in pool",
            "policy_version": n.policy_version if n else None,
            "tokens_per_s": round(n.tokens_per_s, 1) if n else 0.0,
            "accepted": f["accepted"], "rejected": f["hard_invalidated"] +
            f["soft_invalidated"], "hard": f["hard_invalidated"], "pending": f["submitted"],
            # the chain's view, as the orchestrator keeps it (token base units)
            "stake": n.stake if n else 0, "slashed": n.slashed if n else 0,
            "earned": n.rewards_earned if n else 0, "claimed": n.rewards_claimed if n else 0,
            "claimable": n.rewards_claimable if n else 0})
    return rows


async def collect_state(run: Path) -> dict[str, Any]:
    info_path = run / "network.json"
    if not info_path.is_file():
        return {"ready": False, "errors": [f"{info_path} not written yet"]}
    info = json.loads(info_path.read_text())
    errors: list[str] = []
    pool: list[Any] = []
    ledger: list[Any] = []
    try:
        pool, ledger = await _orchestrator(info)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
        errors.append(f"orchestrator: {type(e).__name__}: {e}")
    servers = await _shardcast([*info["relays"], info["origin"]])
    trainer = Path(info["trainer_dir"])
    metrics = _jsonl(trainer / "metrics.jsonl")
    steps = [m for m in metrics if m.get("kind") == "step"][-CURVE_POINTS:]
    evals = [m for m in metrics if m.get("kind") == "eval" and m.get("phase") == "rl"]
    verdicts = _jsonl(run / "logs" / "validator.log",
                      lambda r: r.get("msg") == "verdict" and r.get("verdict") != "accept")
    events = _jsonl(run / "events.jsonl")
    return {
        "ready": True, "errors": errors, "pool_id": info["pool_id"],
        "nodes": _nodes(info, pool, ledger),
        "versions": servers,
        "trained_step": steps[-1]["step"] if steps else 0,
        "reward": [[m["step"], m["reward"]] for m in steps],
        "accuracy": [[m["step"], m["accuracy"]] for m in evals],
        "invalidations": [{"node": v.get("node"), "verdict": v.get("verdict"),
                           "reason": v.get("reason"), "ts": v.get("ts")}
                          for v in verdicts[-50:]],
        "events": [e for e in events if e["event"] != "start"][-30:],
        "flow": flow_state(run, steps, await _pacing(info["orchestrator"]), time.time()),
    }


def collect_state_sync(run: Path) -> dict[str, Any]:
    return asyncio.run(collect_state(run))
