from meshrl.worker.config import HardwareRequirements
from meshrl.worker.hardware import HardwareInfo, missing, probe


def test_probe_reads_this_machine(tmp_path):
    info = probe(tmp_path / "not" / "yet", ["pyarrow", "surely-not-a-package"])
    assert info.cpu_cores >= 1 and info.memory_gb > 0 and info.disk_free_gb > 0
    assert info.torch is not None and info.torch.startswith("2.")
    assert info.packages["pyarrow"] is not None
    assert info.packages["surely-not-a-package"] is None
    assert missing(info, HardwareRequirements(python_packages=["pyarrow"])) == []


def test_missing_names_every_shortfall():
    info = HardwareInfo(cpu_cores=2, memory_gb=3.5, disk_free_gb=1.0, torch="2.1.0+cpu",
                        packages={"safetensors": None})
    req = HardwareRequirements(min_cpu_cores=8, min_memory_gb=16, min_disk_gb=10,
                               min_torch="2.13", python_packages=["safetensors"])
    out = missing(info, req)
    assert out == ["cpu: 2 cores, the pool needs 8",
                   "memory: 3.5 GiB, the pool needs 16.0",
                   "disk: 1.0 GiB free, the pool needs 10.0",
                   "software: torch 2.1.0+cpu, the pool needs >= 2.13",
                   "software: python package 'safetensors' is missing"]
    assert "torch is not installed" in missing(
        HardwareInfo(1, 1, 1, torch=None), HardwareRequirements(python_packages=[]))[0]
