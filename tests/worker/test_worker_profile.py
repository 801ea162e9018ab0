"""A worker reads the pool's proof profile before it stakes and refuses one its setup cannot be
judged fairly by: "meshrl-cpu-engine" holds only for float32 compute (meshrl's CPU engine, or
the reference loop in float32), and its pooled tests reject honest bfloat16 work, which an
"any-hardware" pool accepts."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validator"))
from eth_account import Account
from helpers import PROVIDER, assignment, claim, roundtrip, rules, rules_server
from pydantic import ValidationError

from meshrl.adversaries.worker import CheatingBackend, worker_parts
from meshrl.inference import CPUEngine, EngineConfig
from meshrl.inference.reference import ReferenceBackend
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRulesError, VerdictKind
from meshrl.validator.replay import ReplayConfig, profile_thresholds
from meshrl.validator.verify import verify_file
from meshrl.wire import SignedClient
from meshrl.worker.config import CheatConfig, WorkerConfig
from meshrl.worker.policy import PolicyHolder
from meshrl.worker.profile import accepted_rules, unmet_profile

DEAD_URL = "http://127.0.0.1:9"


def _read(cfg: WorkerConfig, pool_id: int = 1, **work) -> object:
    async def go() -> object:
        async with rules_server(pool_id, **work) as url:
            cfg.orchestrator_url = url
            async with SignedClient(url, Account.create().key) as orch:
                return await accepted_rules(orch, cfg, asyncio.Event())
    return asyncio.run(go())


def test_worker_refuses_a_profile_its_compute_cannot_meet():
    engine, ref = WorkerConfig(), WorkerConfig(backend="reference")
    bf16 = WorkerConfig(backend="reference", dtype="bfloat16")
    assert (engine.backend, engine.dtype) == ("engine", "float32")
    for cfg in (engine, ref, bf16):
        assert unmet_profile(cfg, "any-hardware") is None
    assert unmet_profile(engine, "meshrl-cpu-engine") is None
    assert unmet_profile(ref, "meshrl-cpu-engine") is None
    rules = _read(engine, proof_profile="meshrl-cpu-engine", seed=5)
    assert (rules.proof_profile, rules.seed, rules.pool_id) == ("meshrl-cpu-engine", 5, 1)
    assert _read(bf16, proof_profile="any-hardware").proof_profile == "any-hardware"
    with pytest.raises(PoolRulesError, match="'meshrl-cpu-engine' holds only for float32 compute, "
                       "and this worker computes in bfloat16"):
        _read(bf16, proof_profile="meshrl-cpu-engine")
    with pytest.raises(PoolRulesError, match="manages pool 3, this worker's pool_id is 1"):
        _read(engine, pool_id=3)
    with pytest.raises(ValidationError, match="the engine computes in float32"):
        WorkerConfig(dtype="bfloat16")


def test_the_tight_profile_would_slash_honest_bfloat16_work(tmp_path):
    """Why the worker refuses: an honest bfloat16 worker's file (8 chunks) passes the
    any-hardware thresholds and fails meshrl-cpu-engine's pooled tests; the same worker in
    float32 passes both."""
    tok = CharTokenizer()
    model_dir = save_model(build_model("qwen2-tiny", tok.vocab_size, seed=3), tok, tmp_path / "m")
    validator = CPUEngine.from_pretrained(model_dir, EngineConfig(num_threads=1))
    r = rules(max_new=16, prompts=2, group=4)
    tasks = r.task.build()
    judged = {}
    for dtype in ("float32", "bfloat16"):
        cfg = WorkerConfig(work_dir=str(tmp_path / dtype), backend="reference", dtype=dtype)
        holder = PolicyHolder(cfg, model_dir, 0)
        f = roundtrip(holder.generate(assignment(r), tasks, PROVIDER))[0]
        for profile in ("any-hardware", "meshrl-cpu-engine"):
            replay = ReplayConfig(thresholds=profile_thresholds(profile))
            judged[dtype, profile] = verify_file(validator, tok, f, claim(f), r, tasks, replay)
    for ok in (("float32", "any-hardware"), ("float32", "meshrl-cpu-engine"),
               ("bfloat16", "any-hardware")):
        assert judged[ok].accepted, (ok, judged[ok].reason)
    assert judged["float32", "meshrl-cpu-engine"].stats["pooled"]["exp_mismatch_rate"] == 0.0
    slashed = judged["bfloat16", "meshrl-cpu-engine"]
    assert slashed.kind is VerdictKind.HARD_INVALID
    assert "rollout: exponent mismatch rate" in slashed.reason
    assert slashed.stats["chunks"] == 8
    assert slashed.stats["pooled"]["exp_mismatch_rate"] > 0.005


def test_rules_wait_for_the_orchestrator_until_stopped():
    async def go() -> object:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        cfg = WorkerConfig(orchestrator_url=DEAD_URL, poll_interval=0.1)
        async with SignedClient(DEAD_URL, Account.create().key) as orch:
            return await accepted_rules(orch, cfg, stop)
    assert asyncio.run(go()) is None


def test_reference_backend_worker_keeps_its_honest_weights_through_a_weight_cheat(tmp_path):
    """The reference backend runs the loaded model itself: a weight cheat written into it must
    not become the "honest" weights the worker returns to."""
    tok = CharTokenizer()
    model_dir = save_model(build_model("qwen2-tiny", tok.vocab_size, seed=3), tok, tmp_path / "m")
    cfg = WorkerConfig(work_dir=str(tmp_path / "w"), backend="reference")
    parts = worker_parts(CheatConfig(mode="scale-layer", after_step=0))
    holder = PolicyHolder(cfg, model_dir, 0, parts)
    assert isinstance(holder.engine, CheatingBackend)
    assert isinstance(holder.engine.inner, ReferenceBackend)
    r = rules(max_new=8, prompts=2, group=2, seed=1)
    tasks = r.task.build()

    probe = [[1, 20, 30]], [[40, 41, 42]]
    honest = holder.generate(assignment(r), tasks, PROVIDER)
    honest_lp = holder.engine.score(*probe)[0].logprobs
    # scale-layer weights in the model for a file of version 0 once the cheat is on for it
    # (the holder keeps version 0), then off again
    cheat = holder.engine.cheat
    cheat.cfg = CheatConfig(mode="scale-layer", after_step=-1)
    holder.generate(assignment(r), tasks, PROVIDER)
    assert holder.engine.swapped
    assert not torch.allclose(holder.engine.score(*probe)[0].logprobs, honest_lp)
    cheat.cfg = CheatConfig(mode="scale-layer", after_step=0)
    again = holder.generate(assignment(r), tasks, PROVIDER)
    assert not holder.engine.swapped
    assert [r.completion_tokens for r in again.completions] == \
        [r.completion_tokens for r in honest.completions]
    assert torch.equal(holder.engine.score(*probe)[0].logprobs, honest_lp)
    engine = CPUEngine.from_pretrained(model_dir)  # the fast engine agrees with the reference
    assert torch.allclose(engine.score(*probe)[0].logprobs, honest_lp, atol=1e-4)
