# over 400 lines: the end-of-run report: one reader per source and the markdown they make
"""The end-of-run report (`report.json` + `report.md` in the run directory).

Sources, each what its role wrote or serves: the trainer's `metrics.jsonl` (curves, accuracy)
and `rollouts.jsonl` (files trained on), the orchestrator's ledger (every submission's status
per node, read with the trainer's reader key while the network is still up), the chain through
`meshrl chain balances` (stake and tokens per provider) and `meshrl chain works` (each work
item's reward and state, invalidations, ejections), the role logs (when each policy version was
published and when each worker loaded it; the validator's verdicts), `events.jsonl` and
`faults.json`. The invariants the run must keep are computed from these in `checks.py`.

`give_up` (a Ctrl-C's deadline passed) ends the reads of the orchestrator and the chain where
they are: the report is written with what was read, and says what was not.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshrl.durable import atomic_write
from meshrl.network.checks import RunFacts, dispute_counts, run_checks
from meshrl.network.config import NetworkConfig
from meshrl.wire.models import VerdictKind

__all__ = ["build_report", "write_report"]

GiveUp = Callable[[], bool]


def _never() -> bool:
    return False


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _orchestrator(info: dict[str, Any], give_up: GiveUp = _never) -> tuple[
        list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """The orchestrator's ledger (None when it does not answer) and the nodes of its pool
    (every member, one that joined from another host included)."""
    from meshrl.wire import SignedClient
    from meshrl.wire.models import LedgerPage, PoolNodes

    key = Path(info["trainer_key_file"]).read_text().strip()

    async def read() -> tuple[list[Any], list[Any]]:
        out, after = [], 0
        async with SignedClient(info["orchestrator"], key, timeout_s=10) as c:
            try:
                nodes = (await c.call("GET", "/nodes", response=PoolNodes)).nodes
            except Exception:  # the ledger still names every member that made a file
                nodes = []
            while True:
                page = await c.call("GET", "/ledger", response=LedgerPage,
                                    query={"after": after, "limit": 2000})
                if not page.entries:
                    return out, nodes
                out += page.entries
                after = page.next_after
    async def until_given_up() -> tuple[list[Any], list[Any]]:
        task = asyncio.ensure_future(read())
        while not task.done():
            await asyncio.wait({task}, timeout=0.2)
            if give_up() and not task.done():
                task.cancel()
                raise TimeoutError("the stop's deadline passed")
        return task.result()

    try:
        ledger, nodes = asyncio.run(until_given_up())
    except Exception:  # the orchestrator is down: the report says so instead of failing
        return None, []
    return ([e.model_dump(mode="json") for e in ledger],
            [n.model_dump(mode="json") for n in nodes])


def _start_chain(info: dict[str, Any], verb: str, *args: str) -> subprocess.Popen[str]:
    """`meshrl chain <verb>` started (a process: the network package does not import the chain
    client); the report's reads run side by side, each its own process."""
    argv = [sys.executable, "-m", "meshrl.cli", "chain", verb, "--chain.rpc_url",
            info["rpc_url"], "--chain.deployment", info["deployment"], *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _answer(proc: subprocess.Popen[str], timeout: float = 60,
            give_up: GiveUp = _never) -> list[Any]:
    """A started read's JSON lines, or [] when the chain does not answer (in `timeout`, or
    before `give_up`)."""
    with proc:
        deadline = time.monotonic() + timeout
        try:  # communicate() in short waits, so `give_up` is heard within 0.2 s
            while True:
                try:
                    out, _ = proc.communicate(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if give_up() or time.monotonic() > deadline:
                        return []
        finally:
            if proc.poll() is None:
                proc.kill()
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def _start_works(info: dict[str, Any]) -> subprocess.Popen[str]:
    return _start_chain(info, "works", "--pool", str(info["pool_id"]))


def works_history(info: dict[str, Any], give_up: GiveUp = _never) -> dict[str, Any] | None:
    """The pool's work items and their events (`meshrl chain works`), None when the chain does
    not answer (or `give_up` says to stop asking)."""
    out = _answer(_start_works(info), timeout=300, give_up=give_up)
    return out[-1] if out else None


def _start_balances(info: dict[str, Any], others: list[str]) -> subprocess.Popen[str]:
    """Stake, tokens and bond of the workers' providers, the validators and `others` (the
    providers of members from elsewhere)."""
    who = {*(w["provider"] for w in info["workers"].values()), *others,
           *(v["address"] for v in (info.get("validators") or {}).values())}
    return _start_chain(info, "balances", "--addresses", json.dumps(sorted(who)))


def _accuracy_goal(cfg: NetworkConfig) -> bool:
    """Whether the trainer means to reach the 80% target (it stops at an accuracy >= 0.8)."""
    import tomllib

    goal = cfg.train.get("stop_at_accuracy")
    if goal is None and Path(cfg.train_config).is_file():
        goal = tomllib.loads(Path(cfg.train_config).read_text()).get("stop_at_accuracy")
    return goal is not None and 0.8 <= goal <= 1.0


def _adapter_weights(root: Path) -> dict[int, dict[str, str]]:
    """Per adapter version, the trainer's stated weights hash and each role's merged one."""
    out: dict[int, dict[str, str]] = defaultdict(dict)
    for r in _lines(root / "logs" / "trainer.log"):
        if r.get("msg") == "adapter published":
            out[int(r["version"])]["trainer"] = r["effective_sha256"]
    for log in sorted((root / "logs").glob("*.log")):
        if log.stem == "trainer":
            continue
        for r in _lines(log):
            if r.get("msg") == "fetched" and r.get("payload") == "adapter":
                out[int(r["version"])].setdefault(log.stem, r.get("effective_sha256", ""))
    return dict(out)


def _forged(root: Path, workers: dict[str, dict[str, Any]]) -> dict[str, set[tuple[int, int]]]:
    """Per dishonest worker whose log states what it forged, the (version, counter) of each of
    its files with a forged row ("rewards forged") or a forged tool output ("tools forged")."""
    out: dict[str, set[tuple[int, int]]] = {}
    for name, w in workers.items():
        if not w["dishonest"]:
            continue
        lines = _lines(root / "logs" / f"{name}.log")
        said = [r for r in lines if r.get("msg") in ("rewards forged", "tools forged")]
        if said:
            out[name] = {(int(r["version"]), int(r["counter"])) for r in said
                         if r.get("rows", r.get("outputs", 0)) > 0}
    return out


def _broadcast(root: Path, workers: list[str]) -> list[dict[str, Any]]:
    trainer = _lines(root / "logs" / "trainer.log")
    published = {r["version"]: r["ts"] for r in trainer if r.get("msg") == "published"}
    stored = {r["version"]: r for r in trainer if r.get("msg") == "version stored"}
    loaded: dict[int, dict[str, float]] = defaultdict(dict)
    by_delta: dict[int, set[str]] = defaultdict(set)  # workers that rebuilt it from a delta
    for name in workers:
        for r in _lines(root / "logs" / f"{name}.log"):
            if r.get("msg") in ("policy loaded", "fetched") and "version" in r:
                loaded[r["version"]].setdefault(name, r["ts"])
            if r.get("msg") == "fetched" and r.get("payload") == "delta":
                by_delta[r["version"]].add(name)
    out = []
    for v, t in sorted(published.items()):
        per = {n: round(loaded[v][n] - t, 2) for n in workers if n in loaded[v]}
        kind = stored.get(v, {})
        out.append({"version": v, "workers_loaded": len(per), "max_s": max(per.values(),
                    default=None), "per_worker_s": per, "kind": kind.get("payload", "full"),
                    "bytes": kind.get("bytes"), "fetch_bytes": kind.get("fetch_bytes"),
                    "workers_by_delta": len(by_delta[v])})
    return out


def external_nodes(info: dict[str, Any], ledger: list[dict[str, Any]],
                   pool: list[dict[str, Any]],
                   chain: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The nodes that are not this network's own workers (a member that joined from another
    host) but that the pool lists, that have ledger rows or that earned on chain: address ->
    {"node", "provider"} (the provider as the pool or the ledger names it)."""
    own = {w["node"].lower() for w in info["workers"].values()}
    out: dict[str, dict[str, Any]] = {}
    for n in [*pool, *ledger]:
        a = (n.get("address") or n["node"]).lower()
        if a not in own:
            out.setdefault(a, {"node": n.get("address") or n["node"],
                               "provider": n.get("provider")})
    for a in (chain or {}).get("rewards", {}):
        if a.lower() not in own:
            out.setdefault(a.lower(), {"node": a, "provider": None})
    return out


def _node_rows(info: dict[str, Any], ledger: list[dict[str, Any]],
               records: list[dict[str, Any]], chain: dict[str, Any] | None,
               balances: dict[str, dict[str, Any]],
               pool: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One row per node: the network's own workers by name, then every other node
    (`external_nodes`) by its address, counted the same way."""
    used = Counter(f["node"].lower() for r in records for f in r["used"])
    rewards = {a.lower(): v for a, v in (chain or {}).get("rewards", {}).items()}
    members = {name: {**w, "external": False} for name, w in info["workers"].items()}
    members |= {x["node"]: {**x, "dishonest": None, "external": True}
                for x in external_nodes(info, ledger, pool or [], chain).values()}
    nodes = {}
    for name, w in members.items():
        node = w["node"].lower()
        mine = [e for e in ledger if e["node"].lower() == node]
        slashed = [i["slashed"] for i in (chain or {}).get("invalidations", [])
                   if i["node"].lower() == node]
        pay = rewards.get(node, {"earned": 0, "claimable": 0, "claimed": 0})
        bal = balances.get((w["provider"] or "").lower(), {})
        nodes[name] = {
            "node": w["node"], "provider": w["provider"], "dishonest": w["dishonest"],
            "external": w["external"],
            "files": dict(Counter(e["status"] for e in mine)),
            "not_granted": sum(not e["granted"] for e in mine),
            "trained_on": used.get(node, 0), "tokens": sum(e["work_units"] for e in mine),
            "rewards_earned": None if chain is None else pay["earned"],
            "rewards_claimable": None if chain is None else pay["claimable"],
            "rewards_claimed": None if chain is None else pay["claimed"],
            "stake": bal.get("stake"), "token_balance": bal.get("tokens"),
            "stake_slashed": None if chain is None else sum(slashed)}
    return nodes


def _flow(metrics: list[dict[str, Any]], records: list[dict[str, Any]],
          ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the trainer's time went and how much paid work it threw away: its idle share
    (seconds waiting for batches over seconds of steps; the part of the wait spent reading the
    files is `load_share`), the validator's lag (files submitted and not yet judged, when each
    step began), and the accepted files it took but dropped as stale."""
    steps = [m for m in metrics if m.get("kind") == "step"]
    total = sum(m["step_seconds"] for m in steps)
    lags = [m["validator_lag"] for m in steps if m.get("validator_lag") is not None]
    used = sum(len(r["used"]) for r in records)
    dropped = [d for r in records for d in r["dropped"]]
    stale = sum(d.get("reason") == "stale" for d in dropped)
    taken = used + len(dropped)
    return {
        "steps": len(steps), "step_seconds": round(total, 1),
        "idle_share": None if not total else round(
            sum(m["wait_seconds"] for m in steps) / total, 3),
        "load_share": None if not total else round(
            sum(m.get("load_seconds", 0.0) for m in steps) / total, 3),
        "train_seconds_per_step": None if not steps else round(
            sum(m.get("train_seconds", 0.0) for m in steps) / len(steps), 3),
        "validator_lag_mean": None if not lags else round(sum(lags) / len(lags), 2),
        "validator_lag_max": max(lags, default=None),
        "files_taken": taken, "files_used": used, "stale_dropped": stale,
        "stale_share": None if not taken else round(stale / taken, 4),
        "files_granted": sum(bool(e.get("granted")) for e in ledger),
    }


def _role_kind(name: str) -> str:
    """worker-0 -> worker, validator-1 -> validator (as is the first one, "validator"),
    trainer -> trainer."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def _cpu(root: Path) -> dict[str, Any] | None:
    """Where the machine's CPU went (`cpu.json`, the supervisor's reading of each role's
    process): CPU seconds per kind of role, and each kind's share of all the cores over the
    run (the rest: idle, or processes not of this network)."""
    raw = _lines_json(root / "cpu.json")
    if not raw:
        return None
    kinds: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for name, seconds in raw["roles"].items():
        kind = _role_kind(name)
        kinds[kind] += seconds
        count[kind] += 1
    capacity = raw["wall_s"] * raw["cores"]
    rows = sorted(kinds.items(), key=lambda kv: -kv[1])
    return {"wall_s": raw["wall_s"], "cores": raw["cores"],
            "used_share": round(sum(kinds.values()) / capacity, 3) if capacity else None,
            "kinds": {k: {"roles": count[k], "cpu_s": round(v, 1),
                          "share": round(v / capacity, 3) if capacity else None}
                      for k, v in rows}}


def rl_started(metrics: list[dict[str, Any]], records: list[dict[str, Any]]) -> bool:
    """Whether the trainer got past its warm start (it handed a policy to RL, resumed, or
    took a step): before that no policy was published, so no file could be made."""
    return bool(records) or any(m.get("kind") in ("warm_start", "step", "resume")
                                for m in metrics)


def build_report(cfg: NetworkConfig, root: Path, give_up: GiveUp = _never) -> dict[str, Any]:
    info = json.loads((root / "network.json").read_text())
    metrics = _lines(root / "trainer" / "metrics.jsonl")
    evals = [m for m in metrics if m.get("kind") == "eval" and m.get("phase") == "rl"]
    reached = next((m for m in evals if m["accuracy"] >= 0.8), None)
    records = _lines(root / "trainer" / "rollouts.jsonl")
    works = _start_works(info)  # the chain's reads go on while the orchestrator is read
    read, pool = _orchestrator(info, give_up)
    ledger = read or []
    known = external_nodes(info, ledger, pool, None)  # those with a provider named
    balances = _start_balances(info, [x["provider"] for x in known.values() if x["provider"]])
    chain = next(iter(_answer(works, 300, give_up)[-1:]), None)
    held = {r["address"].lower(): r for r in _answer(balances, 60, give_up)}
    verdicts = _verdicts(root, info)
    facts = RunFacts(records=records, ledger=ledger, chain=chain, workers=info["workers"],
                     cheat_after=cfg.workers.cheat.after_step,
                     async_level=cfg.pool.async_level, evals=evals,
                     accuracy_goal=_accuracy_goal(cfg), verdicts=verdicts,
                     disputes=cfg.chain.dispute_period > 0,
                     weights=_adapter_weights(root), forged=_forged(root, info["workers"]),
                     rl_started=rl_started(metrics, records))
    events = _lines(root / "events.jsonl")
    return {
        "outcome": _lines_json(root / "outcome.json"),
        "accuracy": evals[-1]["accuracy"] if evals else None,
        "reached_80": None if reached is None else {"step": reached["step"],
                                                    "elapsed_s": reached["elapsed"]},
        "steps": max((m["step"] for m in metrics if m.get("kind") == "step"), default=0),
        "curves": None,
        "checks": [c.as_dict() for c in run_checks(facts, ledger_read=read is not None)],
        "phase": "rl" if facts.rl_started else "warm start",
        "nodes": _node_rows(info, ledger, records, chain, held, pool),
        "chain": None if chain is None else {"block": chain["block"], "now": chain["now"]},
        "versions": _broadcast(root, list(info["workers"])),
        "restarts": [e for e in events if e["event"] in ("died", "killed", "recovered", "retired")],
        "faults": _lines_json(root / "faults.json") or [],
        "invalidations": [v for v in verdicts if v.get("verdict") != VerdictKind.ACCEPT],
        "flow": _flow(metrics, records, ledger),
        "cpu": _cpu(root),
        "disputes": _dispute_section(chain, info, held),
    }


def _verdicts(root: Path, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Every validator's `verdict` log lines, each tagged with its validator's role name."""
    names = list(info.get("validators") or {"validator": {}})
    return [{**r, "validator": n} for n in names for r in _lines(root / "logs" / f"{n}.log")
            if r.get("msg") == "verdict"]


def _dispute_section(chain: dict[str, Any] | None, info: dict[str, Any],
                     held: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The verdicts' disputes: counts (accused, challenged, upheld, overturned, open, bond
    moved) in all and per validator, with each validator's bond now."""
    if chain is None:
        return {"counts": None, "validators": {}}
    ds = chain.get("disputes", [])
    who = {v["address"].lower(): n for n, v in (info.get("validators") or {}).items()}
    per = {n: {**dispute_counts([d for d in ds if d["validator"].lower() == a]),
               "rogue": info["validators"][n]["rogue"]} for a, n in who.items()}
    bonds = {a: r.get("bond") for a, r in held.items()}
    for a, n in who.items():
        per[n]["bond"] = bonds.get(a)
    return {"counts": dispute_counts(ds), "validators": per}


def _lines_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def plot_curves(metrics: list[dict[str, Any]], out: Path) -> Path | None:
    """Batch reward per step and held-out accuracy over wall time, for the report (the trainer
    draws its own only when it finishes on its own)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m for m in metrics if m.get("kind") == "step"]
    evals = [m for m in metrics if m.get("kind") == "eval"]
    if not steps and not evals:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([m["step"] for m in steps], [m["reward"] for m in steps], lw=0.8)
    ax1.set(xlabel="RL step", ylabel="batch reward (accepted rollouts)", title="reward")
    for phase, style in (("sft", "o--"), ("rl", "o-")):
        pts = [m for m in evals if m.get("phase") == phase]
        ax2.plot([m["elapsed"] for m in pts], [m["accuracy"] for m in pts], style, label=phase)
    ax2.axhline(0.8, color="grey", lw=0.5)
    ax2.set(xlabel="trainer wall time (s)", ylabel="greedy held-out accuracy", ylim=(0, 1),
            title="held-out accuracy")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def write_report(cfg: NetworkConfig, root: Path, give_up: GiveUp = _never) -> dict[str, Any]:
    rep = build_report(cfg, root, give_up)
    # past a stop's deadline the curves are left out (matplotlib alone took 2 s)
    png = None if give_up() else plot_curves(_lines(root / "trainer" / "metrics.jsonl"),
                                             root / "curves.png")
    rep["curves"] = None if png is None else str(png)
    # whole or not at all: a stop may end the process while the report is written
    atomic_write(root / "report.json", json.dumps(rep, indent=1, default=str), sync=False)
    atomic_write(root / "report.md", _markdown(rep), sync=False)
    return rep


def _dispute_lines(d: dict[str, Any]) -> list[str]:
    c = d.get("counts")
    out = ["", "## Disputes", ""]
    if c is None:
        return [*out, "the chain did not answer"]
    out += [f"- {c['accused']} verdicts: {c['challenged']} challenged, {c['upheld']} upheld, "
            f"{c['overturned']} overturned, {c['open']} open; {c.get('votes', 0)} votes; "
            f"{_tokens(c['bond_moved'])} tokens of validator bond moved to providers, "
            f"{_tokens(c.get('stakes_moved', 0))} of deposits and vote stakes to the side that "
            "was right", "",
            "| validator | rogue | accused | challenged | upheld | overturned | open | "
            "bond lost | bond now |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| {n} | {v['rogue']} | {v['accused']} | {v['challenged']} | {v['upheld']} | "
            f"{v['overturned']} | {v['open']} | {_tokens(v['bond_moved'])} | "
            f"{_tokens(v['bond'])} |" for n, v in d["validators"].items()]
    return out


def _tokens(base_units: int | None) -> str:
    return "n/a" if base_units is None else f"{base_units / 10**18:.3f}"


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.1f}"


def _markdown(rep: dict[str, Any]) -> str:
    acc, checks = rep["accuracy"], rep["checks"]
    failed = [c for c in checks if not c["ok"]]
    out = ["# Network run report", "",
           f"- outcome: {(rep['outcome'] or {}).get('outcome', 'n/a')}",
           f"- held-out accuracy: {'n/a' if acc is None else f'{acc:.3f}'} after "
           f"{rep['steps']} steps",
           "- reached 80%: " + ("no" if not rep["reached_80"] else
                                f"at RL step {rep['reached_80']['step']}, "
                                f"{_s(rep['reached_80']['elapsed_s'])} s of training"),
           *(["- stopped before RL, in the trainer's warm start (no policy published)"]
             if rep.get("phase") == "warm start" else []),
           f"- checks: {len(checks) - len(failed)} of {len(checks)} hold"
           + (f" (failed: {', '.join(c['name'] for c in failed)})" if failed else ""),
           f"- curves: `{rep['curves']}`", "", "## Checks", ""]
    out += [f"- **{c['status'].upper()}** `{c['name']}`: {c['summary']}" for c in checks]
    out += ["", "## Nodes", "",
            "Rewards in tokens, from the chain: earned counts valid work only (claimed, or "
            "submitted and not wiped by a hard invalidation); claimable is unlocked now.", "",
            "| node | dishonest | files | not granted | trained on | work units | earned | "
            "claimable | claimed | stake | slashed |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, n in rep["nodes"].items():
        files = ", ".join(f"{k} {v}" for k, v in sorted(n["files"].items()))
        dishonest = "unknown (joined)" if n.get("external") else n["dishonest"]
        out.append(f"| {name} | {dishonest} | {files} | {n['not_granted']} | "
                   f"{n['trained_on']} | {n['tokens']} | {_tokens(n['rewards_earned'])} | "
                   f"{_tokens(n['rewards_claimable'])} | {_tokens(n['rewards_claimed'])} | "
                   f"{_tokens(n['stake'])} | {_tokens(n['stake_slashed'])} |")
    out += _flow_markdown(rep.get("flow") or {})
    out += _cpu_markdown(rep.get("cpu"))
    out += ["", "## Policy versions (seconds from publish to load, slowest worker)", "",
            "| version | kind | bytes | bytes with the base | workers | by delta | max s |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| {v['version']} | {v.get('kind', 'full')} | {v.get('bytes')} | "
            f"{v.get('fetch_bytes')} | {v['workers_loaded']} | {v.get('workers_by_delta', 0)} "
            f"| {v['max_s']} |" for v in rep["versions"]]
    out += ["", "## Faults", "", "| role | at s | detect s | recover s |",
            "| --- | --- | --- | --- |"]
    out += [f"| {f['role']} | {f['at_s']} | {_s(f['detect_s'])} | {_s(f['recover_s'])} |"
            for f in rep["faults"]]
    out += ["", "## Role exits (the supervisor's record)", "",
            "| role | event | exit status | alive s |", "| --- | --- | --- | --- |"]
    out += [f"| {e['role']} | {e['event']} | {e.get('rc', '')} | {e.get('alive_s', '')} |"
            for e in rep["restarts"] if e["event"] in ("died", "retired")]
    out += ["", "## Invalidations", ""]
    out += [f"- {v.get('validator', 'validator')}: {v.get('node')} {v.get('verdict')}: "
            f"{v.get('reason')}" for v in rep["invalidations"]]
    out += _dispute_lines(rep.get("disputes") or {})
    return "\n".join(out) + "\n"


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _cpu_markdown(c: dict[str, Any] | None) -> list[str]:
    if not c:
        return []
    out = ["", f"## CPU by role ({c['cores']} cores x {c['wall_s']} s; this network used "
           f"{_share(c['used_share'])})", "", "| role | processes | CPU s | share of the machine |",
           "| --- | ---: | ---: | ---: |"]
    return out + [f"| {k} | {v['roles']} | {v['cpu_s']} | {_share(v['share'])} |"
                  for k, v in c["kinds"].items()]


def _flow_markdown(f: dict[str, Any]) -> list[str]:
    """The trainer's flow: idle share, the validator's lag, stale drops (`_flow`)."""
    if not f:
        return []
    return ["", "## Flow (is the trainer kept busy?)", "",
            f"- trainer idle: {_share(f['idle_share'])} of {f['step_seconds']} s of steps "
            f"(reading files: {_share(f['load_share'])}; training "
            f"{f['train_seconds_per_step']} s per step)",
            f"- validator lag (files submitted, not yet judged, at each step): mean "
            f"{f['validator_lag_mean']}, max {f['validator_lag_max']}",
            f"- accepted files taken: {f['files_taken']}, trained on {f['files_used']}, "
            f"dropped as stale {f['stale_dropped']} ({_share(f['stale_share'])}); files "
            f"granted in all: {f['files_granted']}"]
