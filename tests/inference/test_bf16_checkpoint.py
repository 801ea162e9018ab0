"""A bfloat16 checkpoint (network.publish_dtype = "bfloat16"): the file holds torch's
round-to-nearest-even of the float32 master weights, and every way a role loads it (load_model,
read_weights + the engine, the engine from the directory, the reference backend) computes with
exactly those values upcast, so a worker's and a validator's outputs on it are bit-identical to
each other and to the trainer's own rounded copy."""

import copy

import torch
from safetensors import safe_open

from meshrl.inference import CPUEngine, ReferenceBackend, SamplingParams
from meshrl.model import build_model, load_model, read_weights, save_model

PARAMS = SamplingParams(max_new_tokens=10, seed=3, return_hidden_states=True)


def _outputs(backend, prompts):
    return backend.generate(prompts, PARAMS)


def _identical(a, b) -> None:
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == y.logprobs
        assert torch.equal(x.hidden_states, y.hidden_states)


def test_a_bf16_checkpoint_loads_exactly_into_every_role(tok, tmp_path, random_prompts):
    model = build_model("llama-tiny", tok.vocab_size, seed=5)
    master = {k: v.clone() for k, v in model.state_dict().items()}
    save_model(model, tok, tmp_path / "m", dtype=torch.bfloat16)
    assert all(torch.equal(v, master[k]) for k, v in model.state_dict().items())  # untouched
    rounded = {k: v.to(torch.bfloat16).float() for k, v in master.items()}
    assert not all(torch.equal(rounded[k], v) for k, v in master.items())  # rounding bites

    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for k in keys:
            t = f.get_tensor(k)
            assert t.dtype == torch.bfloat16 and torch.equal(t, master[k].to(torch.bfloat16))
    assert keys == set(master) - {"lm_head.weight"}  # the tied head stays out, as in float32

    loaded = load_model(tmp_path / "m")  # the reference backend's and a validator's load
    for k, v in loaded.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, rounded[k]), k
    state = read_weights(tmp_path / "m")  # a worker's hot load
    assert {v.dtype for v in state.values()} == {torch.bfloat16}

    prompts = random_prompts(4, 3, 9, seed=11)
    trainer = CPUEngine(copy.deepcopy(model), tok)  # the trainer's own rollouts: rounded copy
    trainer.load_weights(rounded, 1)
    worker = CPUEngine(copy.deepcopy(model), tok)
    worker.load_weights(state, 1)
    validator = CPUEngine.from_pretrained(tmp_path / "m")
    validator.load_weights(tmp_path / "m", 1)
    want = _outputs(trainer, prompts)
    _identical(_outputs(worker, prompts), want)
    _identical(_outputs(validator, prompts), want)
    _identical(_outputs(worker.with_weights(state, 2), prompts), want)

    ref = ReferenceBackend(copy.deepcopy(model), tok)
    ref.load_weights(tmp_path / "m", 1)
    assert all(torch.equal(v, rounded[k]) for k, v in ref.model.state_dict().items())
    _identical(_outputs(ReferenceBackend(loaded, tok), prompts), _outputs(ref, prompts))
    got = _outputs(ref, prompts)  # the engine's contract with the reference, on these weights
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for x, y in zip(got, want, strict=True):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
        assert torch.allclose(x.hidden_states, y.hidden_states.float(), atol=1e-2)  # bf16 rows
    unrounded = CPUEngine(copy.deepcopy(model), tok)  # the float32 master computes otherwise
    assert [c.logprobs for c in _outputs(unrounded, prompts)] != [c.logprobs for c in want]
