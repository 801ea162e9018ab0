"""The device a model role computes on: checked before anything heavy is loaded onto it.

`check_device` says what `device` ("cpu", "cuda", "cuda:N") is, its memory and the dtype that
will run there, or refuses with a one-line `DeviceError` (a CUDA device on a machine without
one, an index past the last device, bfloat16 on a GPU without it). `place` moves a model there
in that dtype: the one code path for every device (CPU tests run it with device="cpu").
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

from meshrl.inference.backend import InferenceError

__all__ = ["DeviceError", "DeviceInfo", "check_device", "place"]

GIB = 1024**3


class DeviceError(InferenceError):
    """A device (or a dtype on it) this machine cannot compute on."""


@dataclass(frozen=True)
class DeviceInfo:
    device: str  # as torch names it: "cpu", "cuda:0"
    name: str  # CPU model / GPU name
    memory_gb: float  # total memory of the device (host memory for the CPU)
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _host_memory_gb() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 2)
    except (ValueError, OSError, AttributeError):
        return 0.0


def check_device(device: str, dtype: str) -> DeviceInfo:
    """What `device` is, or a one-line DeviceError when this machine has no such device."""
    import torch

    if device == "cpu":
        return DeviceInfo("cpu", platform.processor() or platform.machine(), _host_memory_gb(),
                          dtype)
    if not device.startswith("cuda"):
        raise DeviceError(f"device {device!r}: expected cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {device!r}: this machine has no CUDA device "
                          f"(torch {torch.__version__}); set device = \"cpu\"")
    index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"device {device!r}: this machine has {count} CUDA device(s), "
                          f"cuda:0 .. cuda:{count - 1}")
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"device {device!r} does not compute in bfloat16; set dtype = "
                          f"\"float16\" or \"float32\"")
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(f"cuda:{index}", props.name, round(props.total_memory / GIB, 2), dtype)


def place(model: Any, device: str, dtype: str) -> Any:
    """`model` on `device` in `dtype` (checked first: `DeviceError`), in eval mode."""
    import torch

    info = check_device(device, dtype)
    return model.to(device=torch.device(info.device), dtype=getattr(torch, dtype)).eval()
