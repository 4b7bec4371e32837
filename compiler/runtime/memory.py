"""Where an array's memory comes from, on any device: new memory, a device copy of host values, or
memory adopted from another library through ``__cuda_array_interface__``. `array` holds what these
return: a NumPy ndarray on the CPU, a `DeviceMemory` on a GPU."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..backends.cuda_driver import _check, _driver
from .cuda_array import DeviceBuffer, DeviceMemory
from .device import get_device


def on_device(device: str, values: np.ndarray):
    """`values` as the memory of an array on `device`: itself on the CPU, a device copy on a GPU."""
    return values if device == "cpu" else DeviceMemory.from_host(values, get_device(device).ordinal)


def copied(device: str, values: np.ndarray, np_dtype):
    """New memory on `device` holding `values` as `np_dtype`, C-contiguous (on the CPU placed as
    `allocate` places it)."""
    if device != "cpu":
        return on_device(device, np.array(values, dtype=np_dtype, order="C", copy=True))
    out = host_memory(values.shape, np_dtype, False)
    np.copyto(out, values, casting="unsafe")
    return out


def allocate(device: str, shape: tuple, np_dtype, zero: bool):
    if device == "cpu":
        return host_memory(shape, np_dtype, zero)
    memory = DeviceMemory.empty(shape, np_dtype, get_device(device).ordinal)
    if zero:
        memory.zero()
    return memory


# A CPU array of at least STAGGER_FROM_BYTES starts STAGGER_BYTES further into its page than the
# array allocated before it. NumPy starts every large array 16 bytes into a page (a mapping plus
# malloc's header), so a kernel's streams at one index (an FWI adjoint reads and writes a dozen
# arrays) all fell into the same sets of the L1 cache. Staggered by seventeen lines (64 arrays in a
# row take every line of a page once), float64 FWI updates ran their forward in 0.64-1.02 of NumPy's
# time and their adjoint in 0.62-0.81 (2-D 512^2 and 1024^2, 3-D 64^3 and 96^3), float32 ones
# 0.52-0.81, the plain waves 0.72-1.03 (benchmarks/README.md). Each keeps NumPy's 16 bytes past a
# line: on lines, the 2-D 512^2 waves ran 1.14x (float32 forward) and 1.17x (float64 adjoint)
# NumPy's time, 0.98 and 0.91 with the 16 bytes (3-D 8th-order float64 kernels ran 8-11% faster on
# lines, float32 ones 4-10% slower). A smaller array stays in cache and keeps NumPy's placement.
PAGE_BYTES = 4096
LINE_BYTES = 64
STAGGER_BYTES = 17 * LINE_BYTES
PAST_LINE_BYTES = 16
STAGGER_FROM_BYTES = 64 << 10
_staggered = itertools.count()


def host_memory(shape: tuple, np_dtype, zero: bool) -> np.ndarray:
    """A new C-contiguous host array (zeros where `zero`), placed as the comment above says: a view
    into a buffer two pages longer."""
    nbytes = math.prod(shape) * np.dtype(np_dtype).itemsize
    if nbytes < STAGGER_FROM_BYTES:
        return (np.zeros if zero else np.empty)(shape, np_dtype)
    offset = (PAST_LINE_BYTES + next(_staggered) * STAGGER_BYTES) % PAGE_BYTES
    raw = (np.zeros if zero else np.empty)(nbytes + 2 * PAGE_BYTES, np.uint8)
    start = -raw.ctypes.data % PAGE_BYTES + offset          # (malloc's heap aligns to 16 bytes alone)
    return raw[start:start + nbytes].view(np_dtype).reshape(shape)


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
