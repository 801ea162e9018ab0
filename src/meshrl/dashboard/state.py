"""One JSON snapshot of a running network, from what its roles publish (see the package doc).

`collect_state` reads the sources (the orchestrator's `/nodes`, `/ledger` and `/health`, the
shardcast servers' `/health`); `build_state` makes the snapshot of what they answered and of
the run directory's files (the trainer's `metrics.jsonl`, the role logs, `events.jsonl`), so a
recorded run gives the same page. Each source that does not answer (a role restarting) leaves
its part empty and is named in `errors`, so the page keeps updating through faults.
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
from meshrl.wire.models import LedgerPage, PoolNodes, VerdictKind

__all__ = ["build_state", "collect_state", "flow_state", "trainer_phase",
           "validators_state"]

CURVE_POINTS = 400


def _jsonl(path: Path, keep: Any = None, has: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The JSON lines of `path` that `keep` keeps; with `has`, only lines containing one of
    those strings are parsed (a role's log is mostly lines the page does not show)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{") or (has and not any(h in line for h in has)):
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
# the held-out accuracy the demo aims at (the curve's dashed line)
TARGET = 0.8
# the orchestrator's wait reason when it knows of nothing else (its members may have no policy)
GENERATING = "members are generating"


def flow_state(run: Path, steps: list[dict[str, Any]], pacing: dict[str, Any] | None,
               now: float, phase: dict[str, Any] | None = None,
               nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Is the trainer kept busy: its idle share and the validator's lag (its metrics' last
    step), the stale drops, the pool's pacing, and why the trainer or the pool waits now (their
    last wait lines, while fresh). The pool says its members are generating when it knows no
    other reason; before any member holds a policy (the trainer's warm start, or the first
    fetch) that line says so instead."""
    last = steps[-1] if steps else {}
    waits = []
    for role, msgs in (("trainer", ("step waiting for accepted files",
                                    "step waiting for verdicts")),
                       ("orchestrator", ("pool step waiting",))):
        rec = _tail(run / "logs" / f"{role}.log", msgs)
        if rec is not None and now - rec.get("ts", 0) <= WAIT_FRESH_S:
            waits.append({"role": role, "msg": rec["msg"], "why": rec.get("why", ""),
                          "ts": rec.get("ts")})
    no_policy = _no_policy_why(phase, nodes)
    for w in waits:
        if w["role"] == "orchestrator" and w["why"] == GENERATING and no_policy:
            w["why"] = no_policy
    return {"idle_share": last.get("idle_share"), "validator_lag": last.get("validator_lag"),
            "dropped_stale": last.get("dropped_stale"), "pacing": pacing, "waiting": waits}


def _no_policy_why(phase: dict[str, Any] | None, nodes: list[dict[str, Any]] | None) -> str:
    """Why no member generates yet ("" when some member holds a policy)."""
    if phase is not None and phase["phase"] != "rl":
        return ("no policy published yet: the trainer is in its warm start; members wait for "
                "its first version")
    if nodes and all(r["policy_version"] is None for r in nodes):
        return "no member has loaded a policy yet: members are fetching the first version"
    return ""


def trainer_phase(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What the trainer is doing, from its metrics: `starting` (nothing written yet), `warm
    start` (the step, held-out accuracy and loss of its last supervised evaluation, with the
    step budget and the accuracy that ends it when the trainer states them), or `rl` (its last
    RL step, its last RL evaluation, and what the warm start handed over)."""
    if not metrics:
        return {"phase": "starting", "elapsed": None}
    elapsed = next((m["elapsed"] for m in reversed(metrics) if "elapsed" in m), None)
    handed = next((m for m in metrics if m.get("kind") == "warm_start"), None)
    rl = any(m.get("kind") in ("warm_start", "step", "resume") for m in metrics)
    if not rl:
        evals = [m for m in metrics if m.get("kind") == "eval" and m.get("phase") == "sft"]
        sft = [m for m in metrics if m.get("kind") == "sft"]
        last = evals[-1] if evals else {}
        plan = sft[-1] if sft else {}
        return {"phase": "warm start", "step": last.get("step"),
                "accuracy": last.get("accuracy"), "loss": plan.get("loss"),
                "max_steps": plan.get("max_steps"), "target": plan.get("target"),
                "elapsed": elapsed}
    steps = [m for m in metrics if m.get("kind") == "step"]
    evals = [m for m in metrics if m.get("kind") == "eval" and m.get("phase") == "rl"]
    return {"phase": "rl", "step": steps[-1]["step"] if steps else 0,
            "accuracy": evals[-1]["accuracy"] if evals else None,
            "eval_step": evals[-1]["step"] if evals else None,
            "warm_start": None if handed is None else {
                "steps": int(handed.get("steps", 0)), "accuracy": handed.get("accuracy")},
            "elapsed": elapsed}


def _short(address: str) -> str:
    return address[:6] + "…" + address[-4:]


def _nodes(info: dict[str, Any], pool: list[Any], ledger: list[Any]) -> list[dict[str, Any]]:
    """Every node: the network's own workers (by name), then every other node the pool knows
    (a member that joined from elsewhere, named by its address) or that has files."""
    by_addr = {n.address.lower(): n for n in pool}
    files: dict[str, Counter[str]] = defaultdict(Counter)
    seen: dict[str, str] = {}  # lowercase -> address as written
    for e in ledger:
        files[e.node.lower()][e.status.value] += 1
        seen.setdefault(e.node.lower(), e.node)
    known = {w["node"].lower(): (name, w) for name, w in info["workers"].items()}
    order = [*known, *(a for a in by_addr if a not in known),
             *(a for a in seen if a not in known and a not in by_addr)]
    rows = []
    for a in order:
        name, w = known.get(a, (None, None))
        n = by_addr.get(a)
        address = w["node"] if w else n.address if n else seen[a]
        f = files[a]
        rows.append({
            "name": name or _short(address), "node": address, "external": w is None,
            "dishonest": bool(w and w["dishonest"]),
            "state": n.state.value if n else "not in pool",
            # -1: no policy loaded yet
            "policy_version": n.policy_version if n and n.policy_version >= 0 else None,
            "tokens_per_s": round(n.tokens_per_s, 1) if n else 0.0,
            "accepted": f["accepted"], "rejected": f["hard_invalidated"] +
            f["soft_invalidated"], "hard": f["hard_invalidated"], "pending": f["submitted"],
            # the chain's view, as the orchestrator keeps it (token base units)
            "stake": n.stake if n else 0, "slashed": n.slashed if n else 0,
            "earned": n.rewards_earned if n else 0, "claimed": n.rewards_claimed if n else 0,
            "claimable": n.rewards_claimable if n else 0})
    return rows


def _validator_names(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """network.json's validators in share order (a run from before it lists one)."""
    vals = info.get("validators") or {}
    if not vals and info.get("validator"):
        vals = {"validator": {"address": info["validator"], "rogue": False}}
    return vals


def in_share(work_id: str | int, index: int, of: int) -> bool:
    """Whether validator `index` of `of` judges `work_id` (hex, or its integer) of its own
    accord: the work id as a big-endian integer, mod `of` (the validator's `share`,
    validator/config.py)."""
    n = work_id if isinstance(work_id, int) else int(work_id, 16)
    return n % of == index


def _hex(work_id: str) -> int | None:
    """A ledger row's work id as an integer (None: not submitted yet, or not hex)."""
    try:
        return int(work_id, 16) if work_id else None
    except ValueError:
        return None


def validators_state(run: Path, info: dict[str, Any], ledger: list[Any],
                     now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per validator, from its log and the ledger: submissions it judged (accepted of them),
    verdicts it put on chain as accusations, how many of those a settlement overturned (any
    validator's log may record the settlement), its lag (files of its share submitted and not
    yet judged) and the seconds since its last verdict. Also every validator's non-accept
    verdicts, tagged with its name, oldest first."""
    vals = _validator_names(info)
    logs = {n: _jsonl(run / "logs" / f"{n}.log", has=("verdict",)) for n in vals}
    overturned = {r["work_id"]: bool(r.get("overturned")) for lines in logs.values()
                  for r in lines if r.get("msg") == "verdict settled" and "work_id" in r}
    waiting = [w for e in ledger if e.status.value == "submitted"
               and (w := _hex(e.work_id)) is not None]
    rows, invalid = [], []
    for j, (name, v) in enumerate(vals.items()):
        verdicts = [r for r in logs[name] if r.get("msg") == "verdict"]
        last = {(str(r.get("node", "")).lower(), r.get("sha256")): r["verdict"]
                for r in verdicts}  # a verdict logged again after a restart counts once
        accused = {r["work_id"] for r in logs[name] if r.get("msg") == "verdict on chain"
                   and str(r.get("action", "")).startswith("accuse")}
        rows.append({
            "name": name, "address": v.get("address"), "rogue": bool(v.get("rogue")),
            "judged": len(last), "accepted": sum(k == VerdictKind.ACCEPT for k in last.values()),
            "accused": len(accused),
            "overturned": sum(overturned.get(w, False) for w in accused),
            "upheld": sum(overturned.get(w) is False for w in accused),
            "lag": sum(in_share(w, j, len(vals)) for w in waiting),
            "last_verdict_s": None if not verdicts else round(
                now - verdicts[-1].get("ts", now), 1)})
        invalid += [{"validator": name, "node": r.get("node"), "verdict": r.get("verdict"),
                     "reason": r.get("reason"), "ts": r.get("ts")}
                    for r in verdicts if r.get("verdict") != VerdictKind.ACCEPT]
    return rows, sorted(invalid, key=lambda r: r["ts"] or 0)


def build_state(run: Path, info: dict[str, Any], *, pool: list[Any], ledger: list[Any],
                servers: list[dict[str, Any]], pacing: dict[str, Any] | None,
                errors: list[str], now: float) -> dict[str, Any]:
    """The page's snapshot from what the sources answered (`pool`: the orchestrator's nodes,
    `ledger`: its entries, `servers`: the shardcast servers' health, `pacing`: its pacing)
    and the run directory's files."""
    metrics = _jsonl(Path(info["trainer_dir"]) / "metrics.jsonl")
    steps = [m for m in metrics if m.get("kind") == "step"][-CURVE_POINTS:]
    evals = [m for m in metrics if m.get("kind") == "eval"]
    phase = trainer_phase(metrics)
    nodes = _nodes(info, pool, ledger)
    validators, invalid = validators_state(run, info, ledger, now)
    names = {r["node"].lower(): r["name"] for r in nodes}
    events = _jsonl(run / "events.jsonl")
    return {
        "ready": True, "errors": errors, "pool_id": info["pool_id"],
        "phase": phase, "target": TARGET,
        "nodes": nodes,
        "validators": validators,
        "versions": servers,
        "trained_step": steps[-1]["step"] if steps else 0,
        "reward": [[m["step"], m["reward"]] for m in steps],
        # held-out accuracy over the trainer's wall time: [seconds, accuracy, step]
        "accuracy": {p: [[m.get("elapsed", 0.0), m["accuracy"], m["step"]] for m in evals
                         if m.get("phase") == p] for p in ("sft", "rl")},
        "invalidations": [{**v, "name": names.get(str(v["node"]).lower(), v["node"])}
                          for v in invalid[-50:]],
        "events": [e for e in events if e["event"] != "start"][-30:],
        "flow": flow_state(run, steps, pacing, now, phase, nodes),
    }


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
    pacing = await _pacing(info["orchestrator"])
    return build_state(run, info, pool=pool, ledger=ledger, servers=servers, pacing=pacing,
                       errors=errors, now=time.time())


def collect_state_sync(run: Path) -> dict[str, Any]:
    return asyncio.run(collect_state(run))
