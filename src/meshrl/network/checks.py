"""The run's invariants, computed from its own records (the report's `checks`).

Inputs are what the roles wrote or serve, as plain dicts: the trainer's per-step records
(`rollouts.jsonl`: `used` / `dropped` files), the orchestrator's ledger entries (`LedgerEntry`
fields), the chain's view of the pool (`meshrl chain works`: work items, invalidations,
ejections, verdicts and their disputes), the validators' verdict log lines and the trainer's
evaluations. Each check says pass / fail / n/a with the numbers it counted; none is true by
construction.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from meshrl.wire.models import VerdictKind

__all__ = ["Check", "RunFacts", "dispute_counts", "run_checks"]

ACCEPTED = "accepted"
INVALID = ("soft_invalidated", "hard_invalidated")
TARGET = 0.8  # held-out accuracy the demo must reach


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "n/a"
    summary: str  # one line with the numbers, for people
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.status != "fail", "status": self.status,
                "summary": self.summary, "numbers": self.numbers}


def _verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


@dataclass
class RunFacts:
    records: list[dict[str, Any]]  # the trainer's rollouts.jsonl lines
    ledger: list[dict[str, Any]]  # every ledger entry
    chain: dict[str, Any] | None  # `meshrl chain works` output (None: the chain did not answer)
    workers: dict[str, dict[str, Any]]  # network.json's workers (node, provider, dishonest)
    cheat_after: int  # the dishonest workers are honest up to this pool step
    async_level: int
    evals: list[dict[str, Any]]  # the trainer's RL-phase eval metrics
    accuracy_goal: bool  # the run means to reach TARGET (its trainer stops at accuracy)
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # validator "verdict" lines
    disputes: bool = False  # verdicts can be disputed (the chain's dispute period is positive)
    # adapter versions: version -> {"trainer": the effective sha256 it stated, role: the
    # sha256 of the weights that role merged} (report.py, from the role logs)
    weights: dict[int, dict[str, str]] = field(default_factory=dict)
    # per dishonest worker whose log says which files it forged ("rewards forged" lines), the
    # (policy version, counter) of those files; a cheater absent here cheats in every file of a
    # version after cheat_after
    forged: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    # the trainer got past its warm start (report.rl_started); before that nothing is published
    rl_started: bool = True

    def used(self) -> list[dict[str, Any]]:
        return [f for r in self.records for f in r["used"]]

    def taken(self) -> list[str]:
        return [f["sha256"] for r in self.records for f in [*r["used"], *r["dropped"]]]

    def granted(self) -> dict[str, dict[str, Any]]:
        return {e["sha256"]: e for e in self.ledger if e["granted"]}

    def node_rows(self, node: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger if e["node"].lower() == node.lower()]


def trained_files_accepted(f: RunFacts) -> Check:
    """Every file trained on is accepted on the row of the node it was granted to, uploaded by
    that node, and was fresh by the async rule at the step that used it."""
    granted, bad, stale = f.granted(), [], []
    for r in f.records:
        for u in r["used"]:
            e = granted.get(u["sha256"])
            if e is None or e["status"] != ACCEPTED or not e["uploaded"] or \
                    e["node"].lower() != u["node"].lower():
                bad.append(u["sha256"][:12])
            elif not 0 <= r["step"] - e["policy_version"] <= f.async_level:
                stale.append(u["sha256"][:12])
    n = len(f.used())
    return Check("trained_files_accepted", _verdict(not bad and not stale),
                 f"{n} files trained on, {len(bad)} not accepted, {len(stale)} stale",
                 {"used": n, "not_accepted": len(bad), "stale": len(stale),
                  "examples": (bad + stale)[:5]})


def no_file_taken_twice(f: RunFacts) -> Check:
    taken = f.taken()
    twice = [s[:12] for s, k in Counter(taken).items() if k > 1]
    return Check("no_file_taken_twice", _verdict(not twice),
                 f"{len(taken)} files taken (used or dropped), {len(twice)} more than once",
                 {"taken": len(taken), "twice": len(twice), "examples": twice[:5]})


def no_accepted_file_lost(f: RunFacts) -> Check:
    """The trainer takes trainable accepted files in acceptance order, so every one accepted
    before the last file it took must be in its records (used or dropped); the ones after it
    were still waiting in its queue when the run ended."""
    trainable = [e for e in f.ledger if e["status"] == ACCEPTED and e["granted"]
                 and e["uploaded"]]
    taken = set(f.taken())
    last = max((e["accepted_seq"] for e in trainable if e["sha256"] in taken), default=0)
    left = [e for e in trainable if e["sha256"] not in taken]
    lost = [e["sha256"][:12] for e in left if e["accepted_seq"] < last]
    waiting = len(left) - len(lost)
    return Check("no_accepted_file_lost", _verdict(not lost),
                 f"{len(trainable)} accepted, {len(trainable) - len(left)} taken, {len(lost)} "
                 f"lost, {waiting} still waiting",
                 {"accepted": len(trainable), "taken": len(trainable) - len(left),
                  "lost": len(lost), "waiting": waiting, "examples": lost[:5]})


def _disputes(f: RunFacts) -> list[dict[str, Any]]:
    return list((f.chain or {}).get("disputes", []))


def _hard_accusations(f: RunFacts, node: str) -> list[dict[str, Any]]:
    return [d for d in _disputes(f) if d["hard"] and d["node"].lower() == node]


def honest_nodes_kept(f: RunFacts) -> Check:
    """No honest node's work is invalidated (on chain or in the ledger), and no honest node is
    ejected but by a hard accusation that was overturned (a rogue validator's: the contract
    ejects the accused node at once; the orchestrator invites it again)."""
    if f.chain is None:
        return Check("honest_nodes_kept", "fail", "the chain did not answer")
    per: dict[str, dict[str, int]] = {}
    for name, w in f.workers.items():
        if w["dishonest"]:
            continue
        node = w["node"].lower()
        wrongly = {d["block"] for d in _hard_accusations(f, node) if d["outcome"] == "overturned"}
        ejections = [x for x in f.chain["ejections"] if x["node"].lower() == node]
        per[name] = {
            "invalidated_rows": sum(e["status"] in INVALID for e in f.node_rows(node)),
            "invalidated_on_chain": sum(i["node"].lower() == node
                                        for i in f.chain["invalidations"]),
            "ejected": sum(x["block"] not in wrongly for x in ejections)}
    bad = {n: v for n, v in per.items() if any(v.values())}
    return Check("honest_nodes_kept", _verdict(not bad),
                 f"{len(per)} honest nodes, {len(bad)} invalidated or ejected", {"nodes": per})


def no_work_judged_twice(f: RunFacts) -> Check:
    """On chain: no work id invalidated twice, and no work both accepted (the ledger row's
    verdict) and invalidated. Each validator's log: no submission given two different verdicts
    by it (the same verdict logged again after a restart, without a second action, is
    counted); two validators may differ, and a dispute settles which one stands."""
    if f.chain is None:
        return Check("no_work_judged_twice", "fail", "the chain did not answer")
    ids = [i["work_id"] for i in f.chain["invalidations"]]
    twice = len(ids) - len(set(ids))
    flipped = sum(e["status"] in INVALID and e["verdict"] == VerdictKind.ACCEPT
                  for e in f.ledger)
    kinds: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    lines: Counter[tuple[str, str, str]] = Counter()
    for v in f.verdicts:
        key = (str(v.get("validator", "")), str(v.get("node", "")).lower(),
               str(v.get("sha256", "")))
        kinds[key].add(str(v.get("verdict")))
        lines[key] += 1
    conflicting = sum(len(k) > 1 for k in kinds.values())
    repeated = sum(n > 1 for n in lines.values())
    return Check("no_work_judged_twice", _verdict(not twice and not flipped and not conflicting),
                 f"{len(ids)} invalidations on chain ({twice} twice), {flipped} accepted then "
                 f"invalidated, {len(kinds)} submissions judged ({conflicting} two ways, "
                 f"{repeated} verdict logged again)",
                 {"invalidations": len(ids), "invalidated_twice": twice,
                  "accepted_then_invalidated": flipped, "judged": len(kinds),
                  "conflicting_verdicts": conflicting, "repeated_verdict_lines": repeated})


def cheater_caught(f: RunFacts, name: str) -> Check:
    """The dishonest worker `name`: its files of versions after `cheat_after` are its
    dishonest ones; the first hard invalidation of its work must be mined before the trainer
    took the batch of (its first dishonest step + 2), it must be slashed and ejected, and none
    of its dishonest files may be trained on. A cheater whose log names the files it forged
    (`forged`) is judged on those: its other files are honest work."""
    check = f"cheater_caught[{name}]"
    node = f.workers[name]["node"].lower()
    forged = f.forged.get(name)
    if forged is None:
        bad = [e for e in f.node_rows(node) if e["policy_version"] > f.cheat_after]
    else:
        bad = [e for e in f.node_rows(node) if (e["policy_version"], e["counter"]) in forged]
    if not bad:
        return Check(check, "fail", f"{name} made no dishonest file after step {f.cheat_after}")
    if f.chain is None:
        return Check(check, "fail", "the chain did not answer")
    first = min(e["policy_version"] for e in bad)
    hard = sorted((i for i in f.chain["invalidations"]
                   if i["hard"] and i["node"].lower() == node), key=lambda i: i["block"])
    # caught when first accused (that locks its reward and ejects it; the slash follows once
    # the dispute period is over), by an accusation not overturned; without disputes the
    # accusation is the slash
    accused = sorted((d for d in _hard_accusations(f, node) if d["outcome"] != "overturned"),
                     key=lambda d: d["block"]) or hard
    ejected = [x for x in f.chain["ejections"] if x["node"].lower() == node]
    dishonest = {e["sha256"] for e in bad}
    trained = [u for u in f.used() if u["node"].lower() == node and u["sha256"] in dishonest]
    slashed = sum(i["slashed"] for i in hard)
    # the trainer step whose batch was not yet taken when the first accusation was mined
    caught_at = None if not accused else 1 + max(
        (r["step"] for r in f.records if r["t"] < accused[0]["ts"]), default=-1)
    ok = (caught_at is not None and caught_at <= first + 2 and slashed > 0 and bool(ejected)
          and not trained)
    return Check(check, _verdict(ok),
                 f"first dishonest file at step {first}; hard-invalidated, slashed "
                 f"{slashed / 10**18:g} tokens and {'ejected' if ejected else 'NOT ejected'} "
                 f"before the trainer took step {caught_at}; {len(trained)} of its "
                 f"{len(bad)} dishonest files trained on",
                 {"first_dishonest_step": first, "caught_before_step": caught_at,
                  "hard_invalidations": len(hard), "slashed": slashed,
                  "ejected": bool(ejected), "dishonest_files": len(bad),
                  "dishonest_trained_on": len(trained),
                  "dishonest_hard_invalidated": sum(e["status"] == "hard_invalidated"
                                                    for e in bad)})


def honest_files_not_invalidated(f: RunFacts) -> Check:
    """With disputes on: every accusation of an honest node's work was overturned or is still
    open (no verdict on honest work stands), and none was settled against it. Counts the
    disputes: accused, challenged, upheld, overturned, open, and the bond moved to providers."""
    ds = _disputes(f)
    if f.chain is None:
        return Check("honest_files_not_invalidated", "fail", "the chain did not answer")
    honest = {w["node"].lower() for w in f.workers.values() if not w["dishonest"]}
    on_honest = [d for d in ds if d["node"].lower() in honest]
    upheld = [d["work_id"][:12] for d in on_honest if d["outcome"] == "upheld"]
    n = dispute_counts(ds)
    n.update(honest_accused=len(on_honest), honest_upheld=len(upheld),
             honest_open=sum(d["outcome"] == "open" for d in on_honest), examples=upheld[:5])
    return Check("honest_files_not_invalidated", _verdict(not upheld),
                 f"{n['accused']} verdicts ({n['challenged']} challenged, {n['upheld']} upheld, "
                 f"{n['overturned']} overturned, {n['open']} open); {len(on_honest)} on honest "
                 f"work, {len(upheld)} of them standing; {n['bond_moved'] / 10**18:g} tokens of "
                 f"bond moved to providers", n)


def dispute_counts(ds: list[dict[str, Any]]) -> dict[str, Any]:
    """accused, challenged, upheld, overturned, open verdicts; votes; bond moved to providers;
    deposits and vote stakes moved to the side that was right."""
    return {"accused": len(ds), "challenged": sum(d["challenged"] for d in ds),
            "votes": sum(d["uphold"] + d["overturn"] for d in ds),
            "stakes_moved": sum(d.get("stakes_moved", 0) for d in ds),
            "upheld": sum(d["outcome"] == "upheld" for d in ds),
            "overturned": sum(d["outcome"] == "overturned" for d in ds),
            "open": sum(d["outcome"] == "open" for d in ds),
            "bond_moved": sum(d["forfeited"] for d in ds)}


def adapter_weights_match(f: RunFacts) -> Check:
    """Every adapter version a worker or validator merged gave the weights the trainer stated
    (n/a when no version went out as an adapter)."""
    if not f.weights:
        return Check("adapter_weights_match", "n/a", "no adapter versions were published")
    stated = {v: w["trainer"] for v, w in f.weights.items() if "trainer" in w}
    merged = [(v, role, h) for v, w in f.weights.items() for role, h in w.items()
              if role != "trainer"]
    wrong = sorted({(v, role) for v, role, h in merged if stated.get(v) != h})
    ok = bool(merged) and not wrong
    return Check("adapter_weights_match", _verdict(ok),
                 f"{len(merged)} merges of {len(stated)} adapter versions by "
                 f"{len({r for _, r, _ in merged})} roles, {len(wrong)} not the trainer's "
                 "weights", {"versions": len(stated), "merges": len(merged),
                             "mismatched": [list(x) for x in wrong[:10]]})


def reached_target(f: RunFacts) -> Check:
    hit = next((m for m in f.evals if m["accuracy"] >= TARGET), None)
    last = f.evals[-1]["accuracy"] if f.evals else None
    if hit is not None:
        return Check("reached_80", "pass", f"held-out accuracy {hit['accuracy']:.3f} at RL step "
                     f"{hit['step']}, {hit['elapsed']:.0f} s into training",
                     {"step": hit["step"], "elapsed_s": hit["elapsed"], "final": last})
    status = "fail" if f.accuracy_goal else "n/a"
    why = "" if f.accuracy_goal else " (this run sets no accuracy goal)"
    return Check("reached_80", status, f"not reached; final held-out accuracy {last}{why}",
                 {"final": last})


def _no_work(f: RunFacts) -> bool:
    """The run stopped in the trainer's warm start and no file exists by any account (the
    trainer's records, the ledger, the chain's work items)."""
    return not f.rl_started and not f.records and not f.ledger and \
        not (f.chain or {}).get("works")


def run_checks(f: RunFacts, ledger_read: bool = True) -> list[Check]:
    """Every check; those that need the ledger fail when it could not be read. A run stopped
    before RL with no file made has nothing to check: every check is n/a."""
    cheaters = [n for n, w in f.workers.items() if w["dishonest"]]
    if _no_work(f):
        names = ["trained_files_accepted", "no_file_taken_twice", "no_accepted_file_lost",
                 "honest_nodes_kept", "no_work_judged_twice",
                 *(["honest_files_not_invalidated"] if f.disputes else []),
                 *(f"cheater_caught[{n}]" for n in cheaters), "adapter_weights_match",
                 "reached_80"]
        last = f.evals[-1]["accuracy"] if f.evals else None
        why = ("the run stopped before RL (in the trainer's warm start): no policy was "
               "published and no file made")
        return [Check(n, "n/a", why, {"final": last} if n == "reached_80" else {})
                for n in names]
    if not ledger_read:
        names = ["trained_files_accepted", "no_accepted_file_lost", "honest_nodes_kept",
                 "no_work_judged_twice", *(f"cheater_caught[{n}]" for n in cheaters)]
        down = [Check(n, "fail", "the orchestrator's ledger could not be read") for n in names]
        return [no_file_taken_twice(f), *down, *_dispute_checks(f), reached_target(f)]
    out = [trained_files_accepted(f), no_file_taken_twice(f), no_accepted_file_lost(f),
           honest_nodes_kept(f), no_work_judged_twice(f), *_dispute_checks(f)]
    return [*out, *(cheater_caught(f, n) for n in cheaters), adapter_weights_match(f),
            reached_target(f)]


def _dispute_checks(f: RunFacts) -> list[Check]:
    return [honest_files_not_invalidated(f)] if f.disputes else []
