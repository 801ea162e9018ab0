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


def test_a_shortfall_ends_the_worker_with_one_line_and_status_1(tmp_path, capsys, monkeypatch):
    """docs/roles.md: every shortfall is listed and `meshrl worker` exits 1, before it reads the
    pool's rules or stakes anything (the orchestrator URL points at nothing)."""
    from eth_account import Account

    from meshrl.cli import main
    from meshrl.worker.keys import write_keystore

    for name in ("provider", "node"):
        write_keystore(Account.create(), "pw", tmp_path / f"{name}.json", iterations=2)
    monkeypatch.setenv("MESHRL_KEYSTORE_PASSWORD", "pw")
    code = main(["worker", "--chain.backend", "eth-tester", "--work_dir", str(tmp_path / "w"),
                 "--keys.provider_keystore", str(tmp_path / "provider.json"),
                 "--keys.node_keystore", str(tmp_path / "node.json"),
                 "--orchestrator_url", "http://127.0.0.1:9",
                 "--hardware.min_cpu_cores", "100000", "--hardware.min_memory_gb", "1e9"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("{")]
    assert code == 1
    assert len(err) == 1 and err[0].startswith("meshrl worker: "), err
    assert "cpu: " in err[0] and "memory: " in err[0], err
