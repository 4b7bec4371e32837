"""Devices: where an array's memory lives and where a kernel runs.

A device is named by a string, as in Warp: ``"cpu"``, ``"cuda"`` (the first GPU) or ``"cuda:N"``.
`get_device` turns such a string into a frozen `Device`. Asking for a CUDA device checks, lazily and
once per process, that an NVIDIA driver and GPU are present, so that importing this module never
touches the driver and CPU-only machines never pay for it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..backends.cuda_driver import _driver

_SPEC = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    """A device: ``kind`` is ``"cpu"`` or ``"cuda"``; ``ordinal`` numbers the GPUs (0 on the CPU)."""
    kind: str
    ordinal: int = 0

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        return "cpu" if self.is_cpu else f"cuda:{self.ordinal}"


CPU = Device("cpu")


def get_device(spec: str | Device | None = None) -> Device:
    """The `Device` named by `spec`: ``None`` or ``"cpu"``, ``"cuda"`` (= ``"cuda:0"``) or ``"cuda:N"``.

    Only parses; use `require_cuda` to check that a GPU is actually there.

    >>> get_device("cuda:1")
    Device(kind='cuda', ordinal=1)
    """
    if spec is None:
        return CPU
    if isinstance(spec, Device):
        return spec
    parsed = _PARSED.get(spec) if type(spec) is str else None
    if parsed is None:
        parsed = _parse(spec)
        if type(spec) is str and len(_PARSED) < 64:
            _PARSED[spec] = parsed     # every GPU launch names its device: parse each name once
    return parsed


_PARSED: dict[str, Device] = {}


def _parse(spec) -> Device:
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...), got {spec!r}")
    kind, ordinal = match.group(1), match.group(2)
    if kind == "cpu":
        if ordinal not in (None, "0"):
            raise ValueError(f"device {spec!r}: there is only one CPU device; use 'cpu'")
        return CPU
    return Device("cuda", int(ordinal or 0))


def _probe_driver() -> tuple[int, str]:
    """(number of CUDA devices, why there are none). Never raises: a missing driver is an answer."""
    try:
        driver = _driver()
    except ImportError as exc:
        return 0, f"cuda-bindings could not be imported: {exc}"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # the bindings raise when libcuda.so itself cannot be found
        return 0, f"cuInit raised {type(exc).__name__}: {exc}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return 0, f"cuInit returned {getattr(err, 'name', err)}"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS:
        return 0, f"cuDeviceGetCount returned {getattr(err, 'name', err)}"
    if count == 0:
        return 0, "cuDeviceGetCount found no devices"
    return count, ""


@functools.lru_cache(maxsize=1)
def _driver_state() -> tuple[int, str]:
    return _probe_driver()


def cuda_device_count() -> int:
    """How many CUDA devices the driver sees (0 without a driver or GPU). Probes the driver once."""
    return _driver_state()[0]


def is_cuda_available() -> bool:
    """Whether at least one CUDA device can be used."""
    return cuda_device_count() > 0


def require_cuda(device: Device) -> None:
    """Raise a `RuntimeError` that says what to do if `device` is a GPU this machine does not have."""
    if not device.is_cuda:
        return
    count, why = _driver_state()
    if count == 0:
        raise RuntimeError(f"CUDA device '{device}' requested but no NVIDIA driver/GPU was found ({why}); "
                           "use device='cpu', or set STEPPER_CUDA_SIM=1 to run on the CUDA simulator")
    if device.ordinal >= count:
        raise RuntimeError(f"CUDA device '{device}' requested but this machine has {count} CUDA device(s) "
                           f"(cuda:0 .. cuda:{count - 1})")
