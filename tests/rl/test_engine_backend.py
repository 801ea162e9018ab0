"""The engine-backed generator draws the same tokens as the built-in one (same sampler)."""

from __future__ import annotations

import pytest
import torch

from meshrl.model import CharTokenizer, build_model
from meshrl.rl.generation import GenParams, make_generator

inference = pytest.importorskip("meshrl.inference")
if not hasattr(inference, "CPUEngine"):
    pytest.skip("meshrl.inference.CPUEngine has not landed on this branch", allow_module_level=True)


def test_engine_and_torch_generators_agree():
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=4)
    prompts = [[1, *tok.encode(f"{a}+{b}=")] for a, b in ((3, 4), (12, 34), (99, 1), (50, 50))]
    params = GenParams(6, temperature=1.0, seed=123)
    engine = make_generator("engine", model, tok)
    ref = make_generator("torch", model, tok)
    a = engine.generate(prompts, params, seq_ids=[0, 1, 2, 3])
    b = ref.generate(prompts, params, seq_ids=[0, 1, 2, 3])
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    # hot reload: new weights change what is generated
    other = build_model("qwen2-tiny", tok.vocab_size, seed=5).state_dict()
    engine.load_weights(other)
    ref.load_weights(other)
    c = engine.generate(prompts, params, seq_ids=[0, 1, 2, 3])
    assert [o.token_ids for o in c] == [o.token_ids for o in ref.generate(prompts, params,
                                                                          [0, 1, 2, 3])]
