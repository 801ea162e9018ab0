"""The report's checks on hand-built run records: each passes on a clean run and fails on the
fault it is there to catch, with the numbers it counted."""

from __future__ import annotations

from typing import Any

from meshrl.network.checks import RunFacts, run_checks

H, C = "0x" + "aa" * 20, "0x" + "cc" * 20  # an honest node, the cheater
TOKEN = 10**18


def _row(seq: int, node: str, version: int, status: str = "accepted", *, acc: int = 0,
         granted: bool = True, counter: int = 0) -> dict[str, Any]:
    return {"seq": seq, "sha256": f"{seq:064x}", "node": node, "counter": counter,
            "policy_version": version, "work_units": 10,
            "status": status, "verdict": "accept" if status == "accepted" else None,
            "verdict_reason": "",
            "granted": granted, "uploaded": granted, "accepted_seq": acc,
            "work_id": f"{seq + 1000:064x}"}


def _ref(e: dict[str, Any]) -> dict[str, Any]:
    return {"sha256": e["sha256"], "node": e["node"], "version": e["policy_version"]}


def _facts() -> RunFacts:
    """Steps 0..3; the cheater (honest up to step 1) is slashed at t=250, before the trainer
    took step 3 (t=300); its step-2 file was never trained on."""
    ledger = [_row(1, H, 0, acc=1), _row(2, C, 0, acc=2), _row(3, H, 1, acc=3),
              _row(4, H, 2, acc=4), _row(5, C, 2, "hard_invalidated"),
              _row(6, H, 3, acc=5), _row(7, H, 3, acc=6)]
    records = [{"step": s, "t": 100.0 * s, "used": [_ref(ledger[i])], "dropped": []}
               for s, i in ((0, 0), (1, 1), (2, 2), (3, 3))]
    records[3]["used"].append(_ref(ledger[5]))
    chain = {"invalidations": [{"work_id": ledger[4]["work_id"], "node": C, "hard": True,
                                "slashed": 50 * TOKEN, "block": 9, "ts": 250}],
             "ejections": [{"node": C, "block": 9, "ts": 250}], "works": [], "rewards": {}}
    verdicts = [{"node": e["node"], "sha256": e["sha256"],
                 "verdict": "hard" if e["status"] != "accepted" else "accept"} for e in ledger]
    return RunFacts(records=records, ledger=ledger, chain=chain,
                    workers={"worker-0": {"node": H, "dishonest": False},
                             "cheater-0": {"node": C, "dishonest": True}},
                    cheat_after=1, async_level=2, evals=[
                        {"step": 2, "elapsed": 40.0, "accuracy": 0.5},
                        {"step": 3, "elapsed": 60.0, "accuracy": 0.85}],
                    accuracy_goal=True, verdicts=verdicts,
                    weights={v: {"trainer": f"{v:064x}", "worker-0": f"{v:064x}",
                                 "validator": f"{v:064x}"} for v in (1, 2)})


def _by_name(f: RunFacts) -> dict[str, dict[str, Any]]:
    return {c.name: c.as_dict() for c in run_checks(f)}


def test_a_clean_run_passes_every_check_with_its_numbers() -> None:
    got = _by_name(_facts())
    assert all(c["ok"] and c["status"] == "pass" for c in got.values()), got
    assert got["trained_files_accepted"]["numbers"]["used"] == 5
    assert got["no_accepted_file_lost"]["numbers"] == {
        "accepted": 6, "taken": 5, "lost": 0, "waiting": 1, "examples": []}
    cheat = got["cheater_caught[cheater-0]"]["numbers"]
    assert (cheat["first_dishonest_step"], cheat["caught_before_step"], cheat["slashed"],
            cheat["dishonest_trained_on"]) == (2, 3, 50 * TOKEN, 0)
    assert got["reached_80"]["numbers"]["step"] == 3


def _fails(f: RunFacts, name: str) -> dict[str, Any]:
    c = _by_name(f)[name]
    assert not c["ok"] and c["status"] == "fail", c
    return c["numbers"]


def test_each_fault_is_caught() -> None:
    f = _facts()
    f.ledger[2]["status"] = "hard_invalidated"  # a file trained on, invalidated later
    assert _fails(f, "trained_files_accepted")["not_accepted"] == 1
    f = _facts()
    f.records[3]["dropped"].append(_ref(f.ledger[0]))
    assert _fails(f, "no_file_taken_twice")["twice"] == 1
    f = _facts()
    f.records[2]["used"] = []  # accepted 4th, before files the trainer took later
    assert _fails(f, "no_accepted_file_lost")["lost"] == 1
    f = _facts()
    f.ledger[3]["status"] = "soft_invalidated"
    assert _fails(f, "honest_nodes_kept")["nodes"]["worker-0"]["invalidated_rows"] == 1
    f = _facts()
    f.chain["invalidations"].append(dict(f.chain["invalidations"][0]))  # type: ignore[index]
    assert _fails(f, "no_work_judged_twice")["invalidated_twice"] == 1
    f = _facts()
    f.verdicts.append({**f.verdicts[0], "verdict": "soft"})
    assert _fails(f, "no_work_judged_twice")["conflicting_verdicts"] == 1


def test_the_cheater_check_needs_timely_slash_ejection_and_nothing_trained() -> None:
    name = "cheater_caught[cheater-0]"
    late = _facts()  # step 4 taken at t=400, before the slash at t=450: three steps late
    late.records.append({"step": 4, "t": 400.0, "used": [_ref(late.ledger[6])], "dropped": []})
    late.chain["invalidations"][0]["ts"] = 450  # type: ignore[index]
    assert _fails(late, name)["caught_before_step"] == 5
    kept = _facts()
    kept.chain["ejections"] = []  # type: ignore[index]
    assert _fails(kept, name)["ejected"] is False
    trained = _facts()
    trained.records[3]["used"].append(_ref(trained.ledger[4]))
    assert _fails(trained, name)["dishonest_trained_on"] == 1
    never = _facts()
    never.cheat_after = 5
    assert "made no dishonest file" in _by_name(never)[name]["summary"]


def test_a_cheater_that_names_its_forged_files_is_judged_on_those_only() -> None:
    """forge_tasks: a cheater forging one task's rows makes honest files too (no row of its
    task, or all of them right); its log names the forged ones, and only those count."""
    name = "cheater-0"
    f = _facts()  # its step-3 file (counter 1) forged nothing: accepted and trained on
    honest_file = _row(8, C, 3, acc=7, counter=1)
    f.ledger.append(honest_file)
    f.records[3]["used"].append(_ref(honest_file))
    assert _fails(f, f"cheater_caught[{name}]")["dishonest_trained_on"] == 1  # step rule
    f.forged = {name: {(2, 0)}}  # its log: the step-2 file (hard-invalidated) was forged
    got = _by_name(f)[f"cheater_caught[{name}]"]
    assert got["ok"], got
    assert (got["numbers"]["dishonest_files"], got["numbers"]["dishonest_trained_on"]) == (1, 0)
    f.forged = {name: {(2, 0), (3, 1)}}  # had the trained file been forged, it fails
    assert _fails(f, f"cheater_caught[{name}]")["dishonest_trained_on"] == 1
    f.forged = {name: set()}  # a log that says it forged nothing: nothing to catch
    assert "made no dishonest file" in _by_name(f)[f"cheater_caught[{name}]"]["summary"]


def test_a_copy_row_is_never_trainable_and_no_goal_means_n_a() -> None:
    f = _facts()
    copy_row = _row(8, C, 3, acc=7, granted=False)
    f.ledger.append(copy_row)  # accepted, but a submission the pool never granted
    f.records[3]["used"].append(_ref(copy_row))
    assert _fails(f, "trained_files_accepted")["not_accepted"] == 1
    f = _facts()
    f.evals[-1]["accuracy"] = 0.7
    assert _fails(f, "reached_80")["final"] == 0.7
    f.accuracy_goal = False
    got = _by_name(f)["reached_80"]
    assert got["ok"] and got["status"] == "n/a"
    f = _facts()
    f.chain = None  # the chain did not answer: nothing about it can pass
    got = _by_name(f)
    assert [got[n]["status"] for n in ("honest_nodes_kept", "no_work_judged_twice",
                                       "cheater_caught[cheater-0]")] == ["fail"] * 3


def test_an_unread_ledger_fails_what_needs_it() -> None:
    got = {c.name: c.status for c in run_checks(_facts(), ledger_read=False)}
    assert got == {"no_file_taken_twice": "pass", "trained_files_accepted": "fail",
                   "no_accepted_file_lost": "fail", "honest_nodes_kept": "fail",
                   "no_work_judged_twice": "fail", "cheater_caught[cheater-0]": "fail",
                   "reached_80": "pass"}


def test_report_rows_and_markdown() -> None:
    from meshrl.network.report import _markdown, _node_rows

    f = _facts()
    f.ledger.append(_row(8, C, 3, "hard_invalidated", granted=False))  # a copy, under C
    chain = {**f.chain, "rewards": {H.lower(): {"earned": 7, "claimable": 5, "claimed": 2}}}
    info = {"workers": {"worker-0": {"node": H, "provider": "0xp0", "dishonest": False},
                        "cheater-0": {"node": C, "provider": "0xp1", "dishonest": True}}}
    nodes = _node_rows(info, f.ledger, f.records, chain, {"0xp1": {"stake": 50 * TOKEN}})
    assert nodes["cheater-0"]["files"] == {"accepted": 1, "hard_invalidated": 2}
    assert (nodes["cheater-0"]["not_granted"], nodes["cheater-0"]["stake_slashed"],
            nodes["cheater-0"]["rewards_earned"], nodes["cheater-0"]["stake"]) == (
        1, 50 * TOKEN, 0, 50 * TOKEN)
    assert (nodes["worker-0"]["rewards_earned"], nodes["worker-0"]["rewards_claimable"],
            nodes["worker-0"]["rewards_claimed"], nodes["worker-0"]["trained_on"]) == (7, 5, 2, 4)
    checks = [c.as_dict() for c in run_checks(f)]
    md = _markdown({"accuracy": 0.85, "steps": 4, "reached_80": None, "curves": None,
                    "outcome": {"outcome": "trained"}, "checks": checks, "nodes": nodes,
                    "versions": [], "faults": [], "invalidations": [],
                    "restarts": [{"event": "retired", "role": "cheater-0", "rc": 3},
                                 {"event": "recovered", "role": "worker-0"}]})
    assert "- checks: 8 of 8 hold" in md
    assert "| cheater-0 | retired | 3 |  |" in md and "| worker-0 | recovered" not in md
    assert "- **PASS** `no_accepted_file_lost`: 6 accepted, 5 taken, 0 lost, 1 still waiting" in md
    assert "| cheater-0 | True | accepted 1, hard_invalidated 2 | 1 | 1 | 30 | 0.000 |" in md


def _dispute(node: str, outcome: str, block: int, ts: int, **kw: Any) -> dict[str, Any]:
    return {"work_id": f"{block:064x}", "node": node, "provider": "0xp", "validator": "0xv",
            "hard": True, "block": block, "ts": ts, "until": ts + 60, "challenged": False,
            "uphold": 0, "overturn": 0, "outcome": outcome, "slashed": 0, "forfeited": 0,
            "settled_ts": None, "due": False, **kw}


def _disputed() -> RunFacts:
    """Disputes on: the cheater accused at t=150 (upheld, slashed at t=450, after the dispute
    period), and a rogue's accusation of the honest node at block 5, which ejected it and was
    overturned (10 tokens of bond to its provider)."""
    f = _facts()
    f.disputes = True
    f.chain["invalidations"][0]["ts"] = 450  # type: ignore[index]
    f.chain["ejections"].append({"node": H, "block": 5, "ts": 120})  # type: ignore[union-attr]
    f.chain["disputes"] = [  # type: ignore[index]
        _dispute(H, "overturned", 5, 120, challenged=True, overturn=1, forfeited=10 * TOKEN),
        _dispute(C, "upheld", 7, 150, uphold=1, slashed=50 * TOKEN)]
    return f


def test_disputes_are_counted_and_no_verdict_on_honest_work_may_stand() -> None:
    got = _by_name(_disputed())
    assert all(c["ok"] for c in got.values()), got
    n = got["honest_files_not_invalidated"]["numbers"]
    assert (n["accused"], n["challenged"], n["upheld"], n["overturned"], n["open"],
            n["bond_moved"], n["honest_accused"], n["honest_upheld"]) == (
        2, 1, 1, 1, 0, 10 * TOKEN, 1, 0)
    # caught at the accusation (t=150, before step 2 was taken), not at the slash (t=450)
    assert got["cheater_caught[cheater-0]"]["numbers"]["caught_before_step"] == 2
    assert got["honest_nodes_kept"]["numbers"]["nodes"]["worker-0"]["ejected"] == 0
    f = _disputed()
    f.chain["disputes"][0]["outcome"] = "upheld"  # type: ignore[index]
    assert _fails(f, "honest_files_not_invalidated")["honest_upheld"] == 1
    assert _fails(f, "honest_nodes_kept")["nodes"]["worker-0"]["ejected"] == 1  # not excused
    f = _disputed()
    f.records.append({"step": 4, "t": 400.0, "used": [_ref(f.ledger[6])], "dropped": []})
    assert _by_name(f)["cheater_caught[cheater-0]"]["numbers"]["caught_before_step"] == 2
    f.chain["disputes"][1]["outcome"] = "overturned"  # type: ignore[index]
    # an overturned accusation is not the catch: the slash (t=450) came three steps late
    assert _fails(f, "cheater_caught[cheater-0]")["caught_before_step"] == 5
    f = _disputed()
    f.disputes = False
    assert "honest_files_not_invalidated" not in _by_name(f)  # verdicts final at once


def test_report_dispute_section() -> None:
    from meshrl.network.checks import dispute_counts
    from meshrl.network.report import _dispute_lines

    ds = _disputed().chain["disputes"]  # type: ignore[index]
    lines = _dispute_lines({"counts": dispute_counts(ds), "validators": {
        "validator-1": {**dispute_counts(ds[:1]), "rogue": True, "bond": 310 * TOKEN}}})
    assert "- 2 verdicts: 1 challenged, 1 upheld, 1 overturned, 0 open; 2 votes; 10.000 " \
           "tokens of validator bond moved to providers, 0.000 of deposits and vote stakes to " \
           "the side that was right" in lines
    assert "| validator-1 | True | 1 | 1 | 0 | 1 | 0 | 10.000 | 310.000 |" in lines
    assert _dispute_lines({"counts": None})[-1] == "the chain did not answer"


def test_adapter_weights_must_be_the_trainers_at_every_role() -> None:
    f = _facts()
    assert _by_name(f)["adapter_weights_match"]["numbers"]["merges"] == 4
    f.weights[2]["worker-0"] = "f" * 64  # one role merged other weights
    assert _fails(f, "adapter_weights_match")["mismatched"] == [[2, "worker-0"]]
    f.weights = {}  # no adapter broadcast: nothing to compare
    assert _by_name(f)["adapter_weights_match"]["status"] == "n/a"


def test_a_run_stopped_in_the_warm_start_has_nothing_to_check() -> None:
    """Stopped before RL (no policy published, no file made, the chain gone with it): every
    check is n/a, none failed; the same facts once RL began fail what they should."""
    from meshrl.network.report import rl_started

    warm = [{"kind": "eval", "phase": "sft", "step": 0, "accuracy": 0.02},
            {"kind": "sft", "step": 10, "accuracy": 0.1, "loss": 1.0}]
    assert not rl_started(warm, [])
    assert rl_started([*warm, {"kind": "warm_start", "steps": 10.0}], [])
    f = RunFacts(records=[], ledger=[], chain=None, workers=_facts().workers, cheat_after=1,
                 async_level=2, evals=[], accuracy_goal=True, disputes=True,
                 rl_started=rl_started(warm, []))
    for read in (True, False):
        got = {c.name: c.as_dict() for c in run_checks(f, ledger_read=read)}
        assert set(got) == {"trained_files_accepted", "no_file_taken_twice",
                            "no_accepted_file_lost", "honest_nodes_kept",
                            "no_work_judged_twice", "honest_files_not_invalidated",
                            "cheater_caught[cheater-0]", "adapter_weights_match", "reached_80"}
        assert all(c["status"] == "n/a" and c["ok"] for c in got.values()), got
        assert "before RL" in got["cheater_caught[cheater-0]"]["summary"]
    f.rl_started = True
    got = {c.name: c.status for c in run_checks(f)}
    assert got["cheater_caught[cheater-0]"] == got["reached_80"] == "fail"
    # a file made all the same (a stranger's, judged on chain): the checks run
    f.rl_started, f.ledger = False, [_row(1, C, 0, "hard_invalidated")]
    assert run_checks(f)[0].status != "n/a"


def test_report_lists_a_stranger_like_any_other_node() -> None:
    """A member that joined from another host (not one of the network's workers): its row is
    counted from the ledger, the chain and its provider's balance like the others'."""
    from meshrl.network.report import _markdown, _node_rows

    f = _facts()
    s = "0x5742616e676572000000000000000000000000D1"
    f.ledger += [{**_row(8, s, 3, acc=7), "provider": "0xp9"},
                 {**_row(9, s, 3, "submitted"), "provider": "0xp9"}]
    f.records[3]["used"].append(_ref(f.ledger[-2]))
    chain = {**f.chain, "rewards": {s.lower(): {"earned": 9, "claimable": 4, "claimed": 1}}}
    info = {"workers": {"worker-0": {"node": H, "provider": "0xp0", "dishonest": False},
                        "cheater-0": {"node": C, "provider": "0xp1", "dishonest": True}}}
    pool = [{"address": s, "provider": "0xp9"},
            {"address": "0x" + "dd" * 20, "provider": "0xp8"}]  # joined, made nothing yet
    nodes = _node_rows(info, f.ledger, f.records, chain, {"0xp9": {"stake": 5 * TOKEN}}, pool)
    assert list(nodes) == ["worker-0", "cheater-0", s, "0x" + "dd" * 20]
    row = nodes[s]
    assert (row["external"], row["provider"], row["files"], row["trained_on"], row["tokens"],
            row["rewards_earned"], row["rewards_claimable"], row["stake"]) == (
        True, "0xp9", {"accepted": 1, "submitted": 1}, 1, 20, 9, 4, 5 * TOKEN)
    assert nodes["0x" + "dd" * 20]["files"] == {} and not nodes["worker-0"]["external"]
    md = _markdown({"accuracy": 0.85, "steps": 4, "reached_80": None, "curves": None,
                    "outcome": {"outcome": "trained"}, "checks": [], "nodes": nodes,
                    "versions": [], "faults": [], "invalidations": [], "restarts": []})
    assert f"| {s} | unknown (joined) | accepted 1, submitted 1 | 0 | 1 | 20 | 0.000 |" in md
