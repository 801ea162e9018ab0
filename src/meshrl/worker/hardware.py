"""What this machine has, and what it lacks for a pool: cores, memory, disk, software.

The probe reads only the standard library and package metadata (no torch import), so a node can
say what is missing before it loads anything heavy; asked about a compute device too
(`device=`), it checks that device with torch (`meshrl.inference.device.check_device`) and
reports it, its memory and the dtype that runs there, or refuses it with a one-line
`DeviceError` (`cuda` on a machine without one).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshrl.worker.config import HardwareRequirements

__all__ = ["HardwareInfo", "missing", "probe"]

GIB = 1024**3


@dataclass(frozen=True)
class HardwareInfo:
    cpu_cores: int
    memory_gb: float
    disk_free_gb: float
    accelerators: list[str] = field(default_factory=list)
    python: str = ""
    torch: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    compute: dict[str, Any] | None = None  # device, name, memory_gb, dtype (when asked)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _accelerators() -> list[str]:
    # NVIDIA devices show up as /dev/nvidia<N> without importing torch or CUDA
    return sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*"))


def probe(work_dir: str | Path, packages: Sequence[str] = (), device: str | None = None,
          dtype: str = "float32") -> HardwareInfo:
    """This machine's resources; disk is counted under `work_dir` (or its nearest parent). With
    `device`, also that compute device in `dtype` (`DeviceError` when it is not there)."""
    compute = None
    if device is not None:
        from meshrl.inference.device import check_device

        compute = check_device(device, dtype).to_dict()
    path = Path(work_dir).resolve()
    while not path.exists():
        path = path.parent
    return HardwareInfo(
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        memory_gb=round(_memory_bytes() / GIB, 2),
        disk_free_gb=round(shutil.disk_usage(path).free / GIB, 2),
        accelerators=_accelerators(),
        python=platform.python_version(),
        torch=_version("torch"),
        packages={p: _version(p) if importlib.util.find_spec(p.replace("-", "_")) else None
                  for p in packages},
        compute=compute,
    )


def _major_minor(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def missing(info: HardwareInfo, req: HardwareRequirements) -> list[str]:
    """Each unmet requirement as a sentence; empty when the machine qualifies."""
    out = []
    if info.cpu_cores < req.min_cpu_cores:
        out.append(f"cpu: {info.cpu_cores} cores, the pool needs {req.min_cpu_cores}")
    if info.memory_gb < req.min_memory_gb:
        out.append(f"memory: {info.memory_gb} GiB, the pool needs {req.min_memory_gb}")
    if info.disk_free_gb < req.min_disk_gb:
        out.append(f"disk: {info.disk_free_gb} GiB free, the pool needs {req.min_disk_gb}")
    if info.torch is None:
        out.append("software: torch is not installed")
    elif _major_minor(info.torch) < _major_minor(req.min_torch):
        out.append(f"software: torch {info.torch}, the pool needs >= {req.min_torch}")
    for pkg in req.python_packages:
        if info.packages.get(pkg) is None:
            out.append(f"software: python package {pkg!r} is missing")
    return out
