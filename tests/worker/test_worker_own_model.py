"""A worker on a model directory of its own: it loads a hub-layout Qwen3 / BPE / chat-template
directory as it is, refuses at start a chat pool whose policy has no chat template, and runs a
model the fast engine cannot (Llama with linear RoPE scaling) on the reference backend."""

from __future__ import annotations

import asyncio
import json

import pytest

from hf_families import save_family
from meshrl.inference import CPUEngine, EngineConfig, ReferenceBackend
from meshrl.model import CharTokenizer, build_model, save_model
from meshrl.pool import PoolRules, PoolRulesError, WorkOrder
from meshrl.worker.config import WorkerConfig
from meshrl.worker.policy import PolicyHolder


def _order(fmt: str) -> WorkOrder:
    rules = PoolRules(pool_id=1, task={"type": "arithmetic", "digits": 2}, prompt_format=fmt,
                      sampling={"max_new_tokens": 4})
    return WorkOrder(rules=rules, step=0, policy_versions=[0], shardcast_servers=[],
                     max_file_bytes=1 << 20, max_units_per_file=10_000)


def _start(model_dir, tmp_path, fmt: str) -> PolicyHolder:
    cfg = WorkerConfig(work_dir=str(tmp_path / "w"), model_dir=str(model_dir),
                       engine=EngineConfig(num_threads=1))
    return asyncio.run(PolicyHolder.start(cfg, _order(fmt)))


def test_worker_takes_a_hub_directory_and_refuses_chat_without_a_template(tmp_path) -> None:
    qwen3 = save_family("qwen3-tied", tmp_path / "qwen3")
    holder = _start(qwen3, tmp_path, "chat")
    assert isinstance(holder.engine, CPUEngine)
    assert holder.tokenizer.has_chat_template and len(holder.tokenizer.eos_token_ids) == 2
    tok = CharTokenizer()
    save_model(build_model("qwen2-tiny", tok.vocab_size), tok, tmp_path / "char")
    assert isinstance(_start(tmp_path / "char", tmp_path, "auto").engine, CPUEngine)
    with pytest.raises(PoolRulesError, match="refusing to start: prompt_format 'chat': the "
                       "policy's tokenizer has no chat template"):
        _start(tmp_path / "char", tmp_path, "chat")


def test_worker_falls_back_to_the_reference_for_a_model_the_engine_cannot_run(tmp_path) -> None:
    d = save_family("llama3.2-tied", tmp_path / "llama")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    holder = _start(d, tmp_path, "raw")
    assert isinstance(holder.engine, ReferenceBackend)
    assert holder.engine.version == 0
