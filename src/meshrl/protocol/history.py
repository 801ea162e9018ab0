"""A pool's work as the chain sees it, for reports (`meshrl chain works`): every work item with
its state and reward, and the invalidations, ejections and claims with their block times.

A reward counts as earned only while its item is valid: submitted and not wiped (an upheld
hard verdict on a provider's node wipes that provider's items of the node submitted before the
verdict whose invalidation windows were still open at it), or claimed. An accused item is not
earned unless its verdict is overturned; one that an open verdict reaches is earned but not
claimable until it is settled. `claimable` is the contract's own view (valid, unlocked, not
wiped, under no open verdict), read at the latest block.
"""

from __future__ import annotations

import time
from typing import Any

from eth_utils import event_abi_to_log_topic

from meshrl.protocol.chain import Protocol
from meshrl.protocol.events import Event
from meshrl.protocol.records import DisputeInfo, Standing, WorkInfo, WorkStatus

__all__ = ["STATUS_NAMES", "leaf_submission", "node_rewards", "pool_disputes", "pool_history",
           "pool_items", "provider_rewards", "submission"]

STATUS_NAMES = {WorkStatus.SUBMITTED: "submitted", WorkStatus.SOFT_INVALIDATED: "soft_invalidated",
                WorkStatus.HARD_INVALIDATED: "hard_invalidated", WorkStatus.CLAIMED: "claimed",
                WorkStatus.ACCUSED: "accused"}


class _Times:
    """Block timestamps, each block read once."""

    def __init__(self, p: Protocol) -> None:
        self.p = p
        self.seen: dict[int, int] = {}

    def __call__(self, block: int) -> int:
        if block not in self.seen:
            self.seen[block] = int(self.p.backend.w3.eth.get_block(block)["timestamp"])
        return self.seen[block]


def _item_id(e: Event) -> bytes:
    """The work id an item-creating event names: a file's, a batch's, an opened leaf's."""
    return bytes(e.args["batch_id" if e.name == "BatchSubmitted" else "work_id"])


def pool_items(events: list[Event], pool: int) -> list[Event]:
    """The events that made the pool's work items, in order: `WorkSubmitted` (a file),
    `BatchSubmitted` (a batch, one item under its batch id) and `LeafOpened` of one of its
    batches that is not a copy (a file taken out of its batch: an item of its own, its units
    and reward no longer the batch's). Reading the items' state from the chain then counts
    each reward once."""
    out, batches = [], set()
    for e in events:
        a = e.args
        if e.name == "WorkSubmitted" and a["pool"] == pool:
            out.append(e)
        elif e.name == "BatchSubmitted" and a["pool"] == pool:
            batches.add(bytes(a["batch_id"]))
            out.append(e)
        elif e.name == "LeafOpened" and bytes(a["batch_id"]) in batches and not a["copy"]:
            out.append(e)
    return out


def _sha(e: Event) -> str:
    """The file (or, for a batch, the root) an item-creating event names."""
    return bytes(e.args["root" if e.name == "BatchSubmitted" else "file_sha256"]).hex()


def _works(p: Protocol, submitted: list[Event]) -> list[dict[str, Any]]:
    """Every submitted item's state, standing and claimability, read in JSON-RPC batches
    (three reads per item: one by one, a long run's thousands took minutes)."""
    f = p.contract.functions
    ids = [_item_id(e) for e in submitted]
    got = p.backend.call_many([f.work_info(w) for w in ids] + [f.claimable(w) for w in ids]
                              + [f.standing(w) for w in ids])
    n = len(ids)
    out = []
    for i, (e, wid) in enumerate(zip(submitted, ids, strict=True)):
        w = WorkInfo(*got[i])
        standing = int(got[2 * n + i]) if w.status == WorkStatus.SUBMITTED else Standing.CLEAR
        wiped = standing == Standing.WIPED
        claimable = w.status == WorkStatus.SUBMITTED and not wiped and bool(got[n + i])
        out.append({"work_id": wid.hex(), "node": w.node, "provider": w.provider,
                    "file_sha256": _sha(e), "units": w.units,
                    "reward": w.reward, "status": STATUS_NAMES.get(w.status, str(w.status)),
                    "submitted_at": w.submitted_at, "unlock_at": w.unlock_at,
                    "judge_until": w.judge_until, "wiped": wiped,
                    "disputed": standing == Standing.DISPUTED, "claimable": claimable,
                    "block": e.block, "batch": e.name == "BatchSubmitted"})
    return out


def pool_history(p: Protocol, pool: int) -> dict[str, Any]:
    """The pool's work items and the events that judged, ejected and paid them."""
    times = _Times(p)
    mine: set[bytes] = set()
    providers: set[str] = set()  # claims are per provider: those with work in this pool
    judged: list[dict[str, Any]] = []
    ejected: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    events = p.events().poll()
    submitted = pool_items(events, pool)
    works = _works(p, submitted)
    for w in works:
        mine.add(bytes.fromhex(w["work_id"]))
        providers.add(w["provider"].lower())
    for e in events:
        a = e.args
        if e.name in ("WorkSubmitted", "BatchSubmitted", "LeafOpened"):
            continue
        elif e.name == "WorkInvalidated" and bytes(a["work_id"]) in mine:
            judged.append({"work_id": bytes(a["work_id"]).hex(), "node": a["node"],
                           "hard": a["hard"], "slashed": a["slashed"],
                           "validator": a["validator"], "block": e.block, "ts": times(e.block)})
        elif e.name == "NodeEjected" and a["pool"] == pool:
            ejected.append({"node": a["node"], "block": e.block, "ts": times(e.block)})
        elif e.name == "RewardsClaimed" and a["provider"].lower() in providers:
            claims.append({"provider": a["provider"], "amount": a["amount"],
                           "count": a["count"], "block": e.block, "ts": times(e.block)})
    return {"pool": pool, "block": p.backend.block_number(), "now": p.backend.now(),
            "rewards": node_rewards(works), "works": works, "invalidations": judged,
            "ejections": ejected, "claims": claims,
            "disputes": _disputes(p, events, mine, times)}


def pool_disputes(p: Protocol, pool: int) -> list[dict[str, Any]]:
    """Every verdict on the pool's work since the deployment, with its dispute (see
    `_disputes`)."""
    events = p.events().poll()
    mine = {_item_id(e) for e in pool_items(events, pool)}
    return _disputes(p, events, mine, _Times(p))


def _disputes(p: Protocol, events: list[Event], mine: set[bytes],
              times: _Times) -> list[dict[str, Any]]:
    """One row per accusation of work in `mine`: who accused, hard or soft, when, until when it
    can be disputed (read from the chain while open: a confirmation moves it), whether it was
    challenged, the votes, the federator's ruling (1 uphold, 2 overturn), and its outcome:
    `open` (not settled yet; `due` once its period is over), `upheld` (with the amount
    slashed) or `overturned` (with the bond that went to the provider). A hard verdict on an
    item under a soft one replaces its row. With a dispute period of 0 a verdict is upheld in
    the transaction that makes it."""
    rows: dict[bytes, dict[str, Any]] = {}
    for e in events:
        a = e.args
        wid = bytes(a["work_id"]) if "work_id" in a else b""
        if wid not in mine or e.name == "LeafOpened":
            continue
        if e.name == "WorkAccused":
            rows[wid] = {"work_id": wid.hex(), "node": a["node"], "provider": a["provider"],
                         "validator": a["validator"], "hard": a["hard"], "block": e.block,
                         "ts": times(e.block), "until": a["until"], "challenged": False,
                         "uphold": 0, "overturn": 0, "outcome": "open", "slashed": 0,
                         "forfeited": 0, "settled_ts": None, "deposit": 0, "ruling": 0,
                         "stakes_moved": 0}
            continue
        row = rows.get(wid)
        if row is None:
            continue
        if e.name == "VerdictChallenged":
            row["challenged"], row["until"] = True, a["until"]
        elif e.name == "VerdictVoted":
            row["uphold" if a["uphold"] else "overturn"] += 1
        elif e.name == "VerdictRuled":
            row["ruling"] = 1 if a["uphold"] else 2
        elif e.name == "VerdictOverturned":
            row.update(outcome="overturned", forfeited=a["forfeited"],
                       settled_ts=times(e.block))
        elif e.name == "WorkInvalidated":
            row.update(outcome="upheld", slashed=a["slashed"], settled_ts=times(e.block))
    # an open verdict's end moves without an event (a co-validator's uphold confirms it): read
    # the records, with what they put at stake, in one batch; `stakes_moved`: the deposit and
    # the losing voters' stakes (half the verdict bond each) that went to the other side
    f = p.contract.functions
    for row, got in zip(rows.values(), p.backend.call_many(
            [f.disputes(w) for w in rows]), strict=True):
        d = DisputeInfo(*got)
        row.update(deposit=d.deposit, ruling=d.ruling, stakes_moved=0)
        if row["outcome"] == "open":
            row["until"] = d.until
        elif row["outcome"] == "upheld":
            row["stakes_moved"] = d.deposit + row["overturn"] * d.stake
        else:
            row["stakes_moved"] = row["uphold"] * d.stake
    now = max(p.backend.now(), int(time.time()))  # the next block's time, at least
    for row in rows.values():
        row["due"] = row["outcome"] == "open" and now >= row["until"]
    return list(rows.values())


def node_rewards(works: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per node (lower-case address): rewards earned (valid: claimed, or submitted and not
    wiped; an accused item is not, until its verdict is overturned), claimable now (under no
    open verdict), and claimed, in token base units."""
    out: dict[str, dict[str, int]] = {}
    for w in works:
        r = out.setdefault(w["node"].lower(), {"earned": 0, "claimable": 0, "claimed": 0})
        valid = w["status"] == "claimed" or (w["status"] == "submitted" and not w["wiped"])
        r["earned"] += w["reward"] if valid else 0
        r["claimable"] += w["reward"] if w["claimable"] else 0
        r["claimed"] += w["reward"] if w["status"] == "claimed" else 0
    return out


def _topic(p: Protocol, name: str) -> str:
    abi = next(i for i in p.contract.abi if i.get("type") == "event" and i["name"] == name)
    return "0x" + event_abi_to_log_topic(abi).hex()


def _address_topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower().removeprefix("0x")


def _logs(p: Protocol, topics: list[Any], max_range: int = 50_000) -> list[Any]:
    """Logs of the protocol matching `topics`, from the deployment block, in bounded ranges."""
    latest, start, out = p.backend.block_number(), p.deployment.block, []
    while start <= latest:
        end = min(latest, start + max_range - 1)
        out += p.backend.w3.eth.get_logs({"address": p.contract.address, "topics": topics,
                                          "fromBlock": start, "toBlock": end})
        start = end + 1
    return out


def provider_rewards(p: Protocol, pool: int, provider: str) -> dict[str, Any]:
    """One provider's work in `pool`, fast over a slow link: its nodes from its own `NodeAdded`
    logs, their submissions from `WorkSubmitted` logs filtered by pool and node at the node
    (topics), then every item's state, claimability and wipe in two JSON-RPC batches, so the
    cost does not grow with the rest of the pool. Amounts in token base units."""
    nodes = {_address_topic(p.decoder.decode(log).args["node"])  # type: ignore[union-attr]
             for log in _logs(p, [_topic(p, "NodeAdded"), _address_topic(provider)])}
    works: list[dict[str, Any]] = []
    if nodes:
        pool_topic = "0x" + f"{pool:064x}"
        logs = _logs(p, [[_topic(p, "WorkSubmitted"), _topic(p, "BatchSubmitted")], None,
                         pool_topic, sorted(nodes)])
        events = [e for e in map(p.decoder.decode, logs) if e is not None]
        if any(e.name == "BatchSubmitted" for e in events):  # its opened leaves are items too
            opened = _logs(p, [_topic(p, "LeafOpened"), None, None, sorted(nodes)])
            events += [e for e in map(p.decoder.decode, opened) if e is not None]
            events.sort(key=lambda e: (e.block, e.log_index))
        events = pool_items(events, pool)
        f = p.contract.functions
        ids = [_item_id(e) for e in events]
        got = p.backend.call_many([f.work_info(w) for w in ids] + [f.claimable(w) for w in ids])
        infos = [WorkInfo(*g) for g in got[:len(ids)]]
        standing = p.backend.call_many([f.standing(w) for w in ids])
        for e, wid, w, can, st in zip(events, ids, infos, got[len(ids):], standing, strict=True):
            if w.provider.lower() != provider.lower():
                continue  # a node that moved to another provider: not this one's work
            wiped = w.status == WorkStatus.SUBMITTED and int(st) == Standing.WIPED
            works.append({"work_id": wid.hex(), "node": w.node, "units": w.units,
                          "reward": w.reward, "status": STATUS_NAMES.get(w.status, str(w.status)),
                          "unlock_at": w.unlock_at, "wiped": wiped,
                          "claimable": bool(can) and w.status == WorkStatus.SUBMITTED
                          and not wiped, "block": e.block, "file_sha256": _sha(e),
                          "batch": e.name == "BatchSubmitted"})
    per_node = node_rewards(works)
    total = {k: sum(r[k] for r in per_node.values()) for k in ("earned", "claimable", "claimed")}
    return {"pool": pool, "provider": provider, "block": p.backend.block_number(),
            "rewards": total, "nodes": per_node, "works": works}


def leaf_submission(p: Protocol, work_id: bytes) -> tuple[Event, Event] | None:
    """The `LeafOpened` event that made `work_id` an item (a file taken out of its batch) and
    its batch's `BatchSubmitted` (the pool, and the block whose hash picks the replayed rows);
    None when no leaf was opened under it."""
    for log in _logs(p, [_topic(p, "LeafOpened"), None, "0x" + work_id.hex()]):
        leaf = p.decoder.decode(log)
        if leaf is None or leaf.args["copy"]:
            continue
        bid = "0x" + bytes(leaf.args["batch_id"]).hex()
        for blog in _logs(p, [_topic(p, "BatchSubmitted"), bid]):
            batch = p.decoder.decode(blog)
            if batch is not None:
                return leaf, batch
    return None


def submission(p: Protocol, work_id: bytes) -> Event | None:
    """The `WorkSubmitted` event of `work_id` (its file's sha256 is only there), read by the
    indexed work id; None when the chain has none."""
    for log in _logs(p, [_topic(p, "WorkSubmitted"), "0x" + work_id.hex()]):
        e = p.decoder.decode(log)
        if e is not None:
            return e
    return None
