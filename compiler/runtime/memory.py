"""Where an array's memory comes from, on any device: new memory, a device copy of host values, or
memory adopted from another library through ``__cuda_array_interface__``. `array` holds what these
return: a NumPy ndarray on the CPU, a `DeviceMemory` on a GPU."""
from __future__ import annotations

import math

import numpy as np

from ..backends.cuda_driver import _check, _driver
from .cuda_array import DeviceBuffer, DeviceMemory
from .device import get_device


def on_device(device: str, values: np.ndarray):
    """`values` as the memory of an array on `device`: itself on the CPU, a device copy on a GPU."""
    return values if device == "cpu" else DeviceMemory.from_host(values, get_device(device).ordinal)


def allocate(device: str, shape: tuple, np_dtype, zero: bool):
    if device == "cpu":
        return (np.zeros if zero else np.empty)(shape, np_dtype)
    memory = DeviceMemory.empty(shape, np_dtype, get_device(device).ordinal)
    if zero:
        memory.zero()
    return memory


def on_gpu(data) -> bool:
    return hasattr(data, "__cuda_array_interface__") and not isinstance(data, np.ndarray)


def adopt_cuda(obj, fn: str):
    """(DeviceMemory, device) sharing the memory an object exposes through
    ``__cuda_array_interface__`` (CuPy, PyTorch, Numba); it must be C-contiguous."""
    iface = obj.__cuda_array_interface__
    shape, dtype = tuple(iface["shape"]), np.dtype(iface["typestr"])
    strides = iface.get("strides")
    if strides is not None and tuple(strides) != DeviceMemory(None, shape, dtype).strides and math.prod(shape) > 1:
        raise ValueError(f"{fn}: the device array is not C-contiguous (strides {tuple(strides)}); make it "
                         "contiguous first (e.g. cupy.ascontiguousarray)")
    ptr = int(iface["data"][0])
    ordinal = _device_ordinal(ptr)
    nbytes = math.prod(shape) * dtype.itemsize
    return DeviceMemory(DeviceBuffer(nbytes, ordinal, ptr=ptr, owner=obj), shape, dtype), f"cuda:{ordinal}"


def gpu_device_of(obj) -> str:
    """The device (``"cuda:N"``) whose memory an object with ``__cuda_array_interface__`` holds."""
    return f"cuda:{_device_ordinal(int(obj.__cuda_array_interface__['data'][0]))}"


def _device_ordinal(ptr: int) -> int:
    """The GPU that owns device pointer `ptr` (the driver knows; an empty array's null pointer is on 0)."""
    if not ptr:
        return 0
    driver = _driver()
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(_check(driver.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))
