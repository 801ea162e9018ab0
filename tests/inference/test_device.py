"""A device for every model role (issue #26): configs, the device check, the one device path.

There is no GPU on the CI machines: the device path is run here with device="cpu" (the same
code a CUDA worker runs), and `cuda` is refused in one line, as a machine without one must.
"""

import pytest
import torch
from pydantic import ValidationError

from meshrl.inference import ReferenceBackend, SamplingParams
from meshrl.inference.device import DeviceError, check_device, place
from meshrl.toploc import Thresholds, build_proofs, verdict, verify_proofs
from meshrl.validator.config import ValidatorConfig
from meshrl.worker.config import WorkerConfig
from meshrl.worker.hardware import probe

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def test_configs_take_device_and_dtype_and_refuse_bad_values_in_one_line():
    w = WorkerConfig(backend="reference", device="cuda:1", dtype="float16")
    assert (w.device, w.dtype) == ("cuda:1", "float16")
    v = ValidatorConfig(backend="reference", device="cuda", dtype="bfloat16")
    assert (v.backend, v.device, v.dtype) == ("reference", "cuda", "bfloat16")
    assert (WorkerConfig().device, ValidatorConfig().dtype) == ("cpu", "float32")
    for cls in (WorkerConfig, ValidatorConfig):
        for bad in ({"device": "gpu"}, {"device": "cuda:x"}, {"dtype": "int8"},
                    {"device": "cuda"}, {"dtype": "bfloat16"}):  # last two: the engine
            with pytest.raises(ValidationError) as e:
                cls(**bad)
            assert len(e.value.errors()) == 1, bad
    with pytest.raises(ValidationError, match="the engine runs on the CPU"):
        WorkerConfig(device="cuda")
    with pytest.raises(ValidationError, match="the engine computes in float32"):
        ValidatorConfig(dtype="float16")


def test_the_cpu_is_reported_with_its_memory_and_dtype(tmp_path):
    info = check_device("cpu", "bfloat16")
    assert (info.device, info.dtype) == ("cpu", "bfloat16") and info.memory_gb > 0
    hw = probe(tmp_path, device="cpu", dtype="float16")
    assert hw.compute == {**check_device("cpu", "float16").to_dict()}
    assert probe(tmp_path).compute is None  # no device asked: torch-free


@no_cuda
def test_a_missing_cuda_device_is_refused_in_one_line(tmp_path):
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(DeviceError) as e:
            check_device(device, "bfloat16")
        assert "\n" not in str(e.value) and "no CUDA device" in str(e.value)
    with pytest.raises(DeviceError):
        probe(tmp_path, device="cuda", dtype="bfloat16")
    with pytest.raises(DeviceError):
        place(torch.nn.Linear(2, 2), "cuda", "float32")


@no_cuda
def test_worker_and_validator_refuse_a_device_that_is_not_there(tmp_path, capsys):
    from meshrl.cli import main

    code = main(["validator", "--backend", "reference", "--device", "cuda", "--dtype",
                 "bfloat16", "--chain.backend", "eth-tester", "--work_dir", str(tmp_path)])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("{")]
    assert code != 0 and len(err) == 1 and "no CUDA device" in err[0], err


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_reference_backend_runs_where_it_is_placed(qwen, random_prompts, dtype):
    """The one device path: place() then ReferenceBackend; results come back on the CPU, the
    proofs of its generation verify against its own prefill in float32 and in its dtype."""
    import copy

    model = place(copy.deepcopy(qwen), "cpu", dtype)
    assert next(model.parameters()).dtype == getattr(torch, dtype)
    backend = ReferenceBackend(model)
    assert backend.device.type == "cpu"
    prompts = random_prompts(4, 3, 9, seed=5)
    params = SamplingParams(max_new_tokens=33, seed=9, ignore_eos=True,
                            return_hidden_states=True)
    gens = backend.generate(prompts, params)
    assert all(g.hidden_states.device.type == "cpu" and len(g.token_ids) == 33 for g in gens)
    assert gens[0].hidden_states.dtype == getattr(torch, dtype)
    fp32 = ReferenceBackend(place(copy.deepcopy(qwen), "cpu", "float32"))
    for judge in (backend, fp32):
        res = judge.score(prompts, gens, return_logits=True)
        assert res[0].logits.dtype == torch.float32 and res[0].logprobs.device.type == "cpu"
        for g, r in zip(gens, res, strict=True):
            out = verdict(verify_proofs(r.hidden_states, build_proofs(g.hidden_states)),
                          Thresholds())
            assert out.accepted, out.reasons
            assert float((torch.tensor(g.logprobs) - r.logprobs).abs().max()) < 0.02
