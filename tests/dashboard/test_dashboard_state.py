"""The dashboard's snapshot (`build_state`) of a recorded run (recorded.py): the trainer's
phase at the warm start and during RL, the validators table, and a member that joined from
elsewhere listed like the network's own workers."""

from __future__ import annotations

from pathlib import Path

from meshrl.dashboard.state import build_state, in_share, trainer_phase
from meshrl.validator.config import ShareConfig

from . import recorded as rec

NOW = 1_000_000.0


def _state(root: Path, nodes: list, ledger: list) -> dict:
    import json

    info = json.loads((root / "network.json").read_text())
    return build_state(root, info, pool=nodes, ledger=ledger, servers=[], pacing=None,
                       errors=[], now=NOW)


def test_warm_start_shows_the_trainer_phase_and_no_policy_yet(tmp_path: Path) -> None:
    rec.write_warm(tmp_path, "http://127.0.0.1:9", NOW)
    s = _state(tmp_path, *rec.warm_orchestrator())
    assert s["phase"] == {"phase": "warm start", "step": 40, "accuracy": 0.22, "loss": 1.0,
                          "max_steps": 400, "target": 0.3, "elapsed": 122.0}
    # the warm start's evaluations are a curve of their own; no RL point, no reward yet
    assert s["accuracy"]["sft"][-1] == [122.0, 0.22, 40] and s["accuracy"]["rl"] == []
    assert s["reward"] == [] and s["target"] == 0.8
    # no node holds a policy (-1): shown as none, and the pool's "members are generating"
    # says why they do not
    assert [r["policy_version"] for r in s["nodes"]] == [None] * 4
    [wait] = s["flow"]["waiting"]
    assert wait["role"] == "orchestrator" and "generating" not in wait["why"]
    assert "warm start" in wait["why"]


def test_rl_phase_and_curves(tmp_path: Path) -> None:
    rec.write_warm(tmp_path, "http://127.0.0.1:9", NOW)
    rec.write_rl(tmp_path, NOW)
    s = _state(tmp_path, *rec.rl_orchestrator())
    assert s["phase"] == {"phase": "rl", "step": 12, "accuracy": 0.84, "eval_step": 12,
                          "warm_start": {"steps": 50, "accuracy": 0.31}, "elapsed": 281.0}
    assert s["trained_step"] == 12 and len(s["reward"]) == 12
    assert [p[2] for p in s["accuracy"]["rl"]] == [0, 6, 12]
    assert [r["policy_version"] for r in s["nodes"]] == [11] * 4
    # members hold a policy now: the pool's own words stand
    assert [w["why"] for w in s["flow"]["waiting"]] == ["members are generating"]


def test_a_stranger_is_listed_like_any_other_node(tmp_path: Path) -> None:
    rec.write_warm(tmp_path, "http://127.0.0.1:9", NOW)
    rec.write_rl(tmp_path, NOW)
    s = _state(tmp_path, *rec.rl_orchestrator())
    names = [r["name"] for r in s["nodes"]]
    assert names[:3] == ["worker-0", "worker-1", "cheater-0"] and len(names) == 4
    [stranger] = [r for r in s["nodes"] if r["external"]]
    assert stranger["node"] == rec.STRANGER and stranger["name"] == "0x5742…00d1"
    assert (stranger["state"], stranger["accepted"], stranger["pending"], stranger["earned"],
            stranger["dishonest"]) == ("healthy", 3, 2, 3 * rec.TOKEN, False)
    # a node with files whose pool entry is gone (ejected and forgotten) is still listed
    nodes, ledger = rec.rl_orchestrator()
    s = _state(tmp_path, [n for n in nodes if n.address != rec.STRANGER], ledger)
    [stranger] = [r for r in s["nodes"] if r["external"]]
    assert (stranger["state"], stranger["accepted"]) == ("not in pool", 3)


def test_validators_table(tmp_path: Path) -> None:
    rec.write_warm(tmp_path, "http://127.0.0.1:9", NOW)
    rec.write_rl(tmp_path, NOW)
    s = _state(tmp_path, *rec.rl_orchestrator())
    got = {v["name"]: {k: v[k] for k in ("rogue", "judged", "accepted", "accused", "upheld",
                                         "overturned", "lag", "last_verdict_s")}
           for v in s["validators"]}
    assert got == {
        "validator": {"rogue": False, "judged": 4, "accepted": 3, "accused": 1, "upheld": 1,
                      "overturned": 0, "lag": 2, "last_verdict_s": 15.0},
        "validator-1": {"rogue": True, "judged": 2, "accepted": 0, "accused": 1, "upheld": 0,
                        "overturned": 1, "lag": 1, "last_verdict_s": 10.0}}
    # every validator's invalidations, tagged, oldest first
    assert [(v["validator"], v["node"]) for v in s["invalidations"]] == [
        ("validator", rec.CHEAT), ("validator-1", rec.STRANGER), ("validator-1", rec.CHEAT)]
    assert [v["name"] for v in s["invalidations"]] == ["cheater-0", "0x5742…00d1", "cheater-0"]
    # a row whose work id is not hex (or not yet on chain) counts in no validator's lag
    nodes, ledger = rec.rl_orchestrator()
    odd = [e.model_copy(update={"work_id": w})
           for e, w in zip(ledger[-2:], ("zz", ""), strict=True)]
    s = _state(tmp_path, nodes, [*ledger[:-2], *odd])
    assert [v["lag"] for v in s["validators"]] == [1, 0]
    # at the warm start: listed, nothing judged
    rec.write_warm(tmp_path / "warm", "http://127.0.0.1:9", NOW)
    s = _state(tmp_path / "warm", *rec.warm_orchestrator())
    assert [(v["name"], v["judged"], v["lag"], v["last_verdict_s"]) for v in s["validators"]] \
        == [("validator", 0, 0, None), ("validator-1", 0, 0, None)]


def test_the_share_rule_is_the_validators() -> None:
    for wid in ("00" * 31 + "04", "ff" * 32, "0x" + "12" * 32, f"{13:064x}"):
        for of in (1, 2, 3):
            for j in range(of):
                assert in_share(wid, j, of) == ShareConfig(index=j, of=of).mine(
                    bytes.fromhex(wid.removeprefix("0x"))), (wid, j, of)


def test_phase_before_any_metric_and_after_a_resume() -> None:
    assert trainer_phase([])["phase"] == "starting"
    resumed = trainer_phase([{"kind": "resume", "step": 30, "checkpoint": "c"},
                             {"kind": "step", "step": 31, "reward": 0.5, "elapsed": 9.0}])
    assert (resumed["phase"], resumed["step"], resumed["warm_start"]) == ("rl", 31, None)
