"""The trainer's rollouts are the same whichever backend generates them (same sampler, same
stopping rules), and each batch carries the policy version that made it."""

from __future__ import annotations

import pytest
import torch

from meshrl.inference import CPUEngine, ReferenceBackend, build_backend
from meshrl.model import CharTokenizer, build_model
from meshrl.rl.config import RolloutConfig
from meshrl.rl.rollouts import generate_batch
from meshrl.tasks import TasksConfig

TOK = CharTokenizer()
CFG = RolloutConfig(prompts_per_step=4, group_size=4, max_new_tokens=6)
TASKS = TasksConfig().build()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _batches(kind: str, version: int = 0):
    model = build_model("qwen2-tiny", TOK.vocab_size, seed=4)
    backend = build_backend(kind, model, TOK)
    first = generate_batch(backend, TOK, CFG, TASKS, 0, 3, 0)
    backend.load_weights(build_model("qwen2-tiny", TOK.vocab_size, seed=5).state_dict(), version)
    return backend, first, generate_batch(backend, TOK, CFG, TASKS, 0, 3, version)


def test_engine_and_reference_rollouts_agree_before_and_after_a_reload():
    engine, e0, e1 = _batches("engine", 7)
    ref, r0, r1 = _batches("reference", 7)
    assert isinstance(engine, CPUEngine) and isinstance(ref, ReferenceBackend)
    for a, b in ((e0, r0), (e1, r1)):
        assert a.completion_ids == b.completion_ids
        assert torch.equal(a.rewards, b.rewards) and a.truncated == b.truncated
        for x, y in zip(a.inference_logprobs, b.inference_logprobs, strict=True):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-4)
    assert e0.completion_ids != e1.completion_ids  # the reload changed what is generated
    assert e1.version == 7


def test_a_batch_from_another_policy_version_is_refused():
    backend = build_backend("engine", build_model("qwen2-tiny", TOK.vocab_size, seed=4), TOK)
    backend.load_weights(build_model("qwen2-tiny", TOK.vocab_size, seed=5).state_dict(), 2)
    with pytest.raises(RuntimeError, match=r"policy versions \[2\], expected 3"):
        generate_batch(backend, TOK, CFG, TASKS, 0, 3, 3)


def test_unknown_backend_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown inference backend 'vllm'"):
        build_backend("vllm", build_model("qwen2-tiny", TOK.vocab_size), TOK)  # type: ignore[arg-type]
