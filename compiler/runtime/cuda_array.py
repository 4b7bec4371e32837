"""Device memory for CUDA arrays: allocation, host <-> device copies, `__cuda_array_interface__`.

Written against the CUDA driver API (cuda-bindings) and not yet run on a GPU: `array` does not use
it yet (`array(..., device="cuda")` raises NotImplementedError after checking that a GPU exists).
The pieces an array on the GPU needs are here, each small enough to check by reading:

    buf = DeviceBuffer.from_host(np.arange(4, dtype=np.float32), ordinal=0)
    host = buf.to_host((4,), np.float32)          # a fresh NumPy array (a copy)
    iface = cuda_array_interface(buf.ptr, (4,), np.float32)

All copies are synchronous with respect to the host and ordered on the legacy default stream, which
is also where `launch_cuda` launches kernels, so no explicit synchronisation is needed between a
launch and a copy of its results.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..backends.cuda_driver import _check, _driver, primary_context

__all__ = ["DeviceBuffer", "cuda_array_interface"]


def _free(ptr: int, ordinal: int) -> None:
    try:
        primary_context(ordinal)
        _driver().cuMemFree(ptr)
    except Exception:       # at interpreter exit the driver may already be gone; nothing to do then
        pass


class DeviceBuffer:
    """`nbytes` of device memory on GPU `ordinal` (cuMemAlloc), freed when collected."""

    def __init__(self, nbytes: int, ordinal: int = 0):
        primary_context(ordinal)
        self.nbytes = int(nbytes)
        self.ordinal = ordinal
        # cuMemAlloc refuses 0 bytes; a 1-byte allocation keeps `ptr` valid and distinct.
        self.ptr = int(_check(_driver().cuMemAlloc(max(self.nbytes, 1)), f"cuMemAlloc({self.nbytes})"))
        self._finalizer = weakref.finalize(self, _free, self.ptr, ordinal)

    @classmethod
    def from_host(cls, values: np.ndarray, ordinal: int = 0) -> "DeviceBuffer":
        buf = cls(values.nbytes, ordinal)
        buf.copy_from_host(values)
        return buf

    def copy_from_host(self, values: np.ndarray, offset: int = 0) -> None:
        values = np.ascontiguousarray(values)
        self._check_range(offset, values.nbytes)
        if values.nbytes:
            primary_context(self.ordinal)
            _check(_driver().cuMemcpyHtoD(self.ptr + offset, values.ctypes.data, values.nbytes), "cuMemcpyHtoD")

    def copy_to_host(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("copy_to_host needs a writeable C-contiguous NumPy array")
        self._check_range(offset, out.nbytes)
        if out.nbytes:
            primary_context(self.ordinal)
            _check(_driver().cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes), "cuMemcpyDtoH")
        return out

    def to_host(self, shape, dtype) -> np.ndarray:
        """A new NumPy array of `shape` and `dtype` holding a copy of the buffer's first bytes."""
        return self.copy_to_host(np.empty(shape, dtype))

    def copy_from(self, src: "DeviceBuffer", nbytes: int, dest_offset: int = 0, src_offset: int = 0) -> None:
        self._check_range(dest_offset, nbytes)
        src._check_range(src_offset, nbytes)
        if nbytes:
            primary_context(self.ordinal)
            _check(_driver().cuMemcpyDtoD(self.ptr + dest_offset, src.ptr + src_offset, nbytes), "cuMemcpyDtoD")

    def zero_(self) -> None:
        if self.nbytes:
            primary_context(self.ordinal)
            _check(_driver().cuMemsetD8(self.ptr, 0, self.nbytes), "cuMemsetD8")

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"{nbytes} bytes at offset {offset} do not fit in a buffer of {self.nbytes} bytes")


def cuda_array_interface(ptr: int, shape: tuple, dtype, strides: tuple | None = None, readonly: bool = False) -> dict:
    """The `__cuda_array_interface__` (version 3) of device memory at `ptr` holding `shape` values
    of NumPy `dtype`; `strides` in bytes (None: C-contiguous). Work is ordered on the legacy default
    stream (stream 1 in the protocol)."""
    return {"shape": tuple(shape), "typestr": np.dtype(dtype).str, "data": (int(ptr), readonly),
            "strides": None if strides is None else tuple(strides), "version": 3, "stream": 1}
