"""A mixed-precision pool (issue #26): `[[workers.compute]]` gives each worker of `meshrl network
up` its own backend, device and dtype; the worker configs it writes load as those, and a
combination no worker could run is refused when the network's config loads."""

from __future__ import annotations

import tomllib

import pytest

from meshrl.config import ConfigError, load_config
from meshrl.network.config import NetworkConfig
from meshrl.network.roles import Layout, build_roles
from meshrl.worker.config import WorkerConfig


def _write(tmp_path, body: str):
    path = tmp_path / "net.toml"
    path.write_text(f'dir = "{tmp_path}"\nbase_port = 20100\nanvil = "/bin/true"\n' + body)
    return path


def test_each_worker_computes_as_its_compute_entry_says(tmp_path) -> None:
    path = _write(tmp_path, "[workers]\nhonest = 2\ndishonest = 1\n"
                  '[[workers.compute]]\nbackend = "engine"\n'
                  '[[workers.compute]]\nbackend = "reference"\ndtype = "bfloat16"\n')
    lay = Layout(load_config(NetworkConfig, [str(path)], []))
    build_roles(lay, lay.keys(), 1)
    got = {}
    for name, _, _ in lay.workers():
        raw = tomllib.loads(lay.config_path(name).read_text())
        w = WorkerConfig.model_validate(raw)
        got[name] = (w.backend, w.device, w.dtype, w.cheat.mode != "none")
    assert got == {"worker-0": ("engine", "cpu", "float32", False),
                   "worker-1": ("reference", "cpu", "bfloat16", False),
                   "cheater-0": ("engine", "cpu", "float32", True)}  # past the list: defaults
    assert lay.cfg.pool.proof_profile == "any-hardware"


@pytest.mark.parametrize("entry", ['backend = "engine"\ndtype = "bfloat16"',
                                   'backend = "reference"\ndevice = "gpu"',
                                   'backend = "reference"\ndtype = "int8"'])
def test_a_compute_no_worker_can_run_is_refused_at_load(tmp_path, entry) -> None:
    path = _write(tmp_path, f"[[workers.compute]]\n{entry}\n")
    with pytest.raises(ConfigError):
        load_config(NetworkConfig, [str(path)], [])
