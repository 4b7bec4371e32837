"""Device memory for CUDA arrays: allocation, host <-> device copies, `__cuda_array_interface__`.

Written against the CUDA driver API (cuda-bindings); tested on the CUDA simulator
(backends/cudasim), which fakes exactly these driver calls. `DeviceMemory` is what a CUDA `array`
holds where a CPU array holds its NumPy ndarray:

    buf = DeviceBuffer.from_host(np.arange(4, dtype=np.float32), ordinal=0)
    host = buf.to_host((4,), np.float32)          # a fresh NumPy array (a copy)
    iface = cuda_array_interface(buf.ptr, (4,), np.float32)

All copies are synchronous with respect to the host and ordered on the legacy default stream, which
is also where `backends.cuda_launch` launches kernels, so no explicit synchronisation is needed between a
launch and a copy of its results.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..backends.cuda_driver import _check, _driver, primary_context

__all__ = ["DeviceBuffer", "DeviceMemory", "cuda_array_interface"]


def _free(ptr: int, ordinal: int) -> None:
    try:
        primary_context(ordinal)
        _driver().cuMemFree(ptr)
    except Exception:       # at interpreter exit the driver may already be gone; nothing to do then
        pass


class DeviceBuffer:
    """`nbytes` of device memory on GPU `ordinal` (cuMemAlloc), freed when collected. `owner` keeps
    memory adopted from another library alive instead (`ptr` given: nothing is allocated or freed)."""

    def __init__(self, nbytes: int, ordinal: int = 0, ptr: int | None = None, owner=None):
        primary_context(ordinal)
        self.nbytes = int(nbytes)
        self.ordinal = ordinal
        if ptr is not None:
            self.ptr, self.owner = int(ptr), owner
            return
        # cuMemAlloc refuses 0 bytes; a 1-byte allocation keeps `ptr` valid and distinct.
        try:
            self.ptr = int(_check(_driver().cuMemAlloc(max(self.nbytes, 1)), f"cuMemAlloc({self.nbytes})"))
        except Exception as e:
            if "OUT_OF_MEMORY" not in str(e):
                raise
            raise MemoryError(f"out of memory on cuda:{ordinal}: could not allocate {_size(self.nbytes)} ({e}); "
                              "free arrays you no longer need, or use smaller ones") from None
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


def _size(nbytes: int) -> str:
    return f"{nbytes} bytes" if nbytes < 2**20 else f"{nbytes / 2**20:.1f} MiB"


class DeviceMemory:
    """A C-contiguous block of `shape` values of NumPy `dtype` at `offset` bytes into a
    `DeviceBuffer`: the device twin of the ndarray a CPU array holds (`shape`, `dtype`, `nbytes`,
    `strides`, `ndim` and `reshape` mean what they mean there). Views share the buffer."""

    def __init__(self, buffer: DeviceBuffer, shape: tuple, dtype, offset: int = 0):
        self.buffer, self.shape, self.dtype, self.offset = buffer, tuple(shape), np.dtype(dtype), offset
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        strides, step = [], self.dtype.itemsize
        for d in reversed(self.shape):
            strides.append(step)
            step *= d
        self.strides = tuple(reversed(strides))

    @classmethod
    def empty(cls, shape: tuple, dtype, ordinal: int) -> "DeviceMemory":
        dtype = np.dtype(dtype)
        return cls(DeviceBuffer(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, ordinal), shape, dtype)

    @classmethod
    def from_host(cls, values: np.ndarray, ordinal: int) -> "DeviceMemory":
        memory = cls.empty(values.shape, values.dtype, ordinal)
        memory.write(values)
        return memory

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ptr(self) -> int:
        return self.buffer.ptr + self.offset

    @property
    def ordinal(self) -> int:
        return self.buffer.ordinal

    def reshape(self, shape) -> "DeviceMemory":
        shape = tuple(shape)
        size = self.nbytes // self.dtype.itemsize
        if shape.count(-1) == 1:
            rest = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
            shape = tuple(size // rest if d == -1 and rest else d for d in shape)
        if int(np.prod(shape, dtype=np.int64)) != size or any(d < 0 for d in shape):
            raise ValueError(f"cannot reshape {size} values into shape {shape}")
        return DeviceMemory(self.buffer, shape, self.dtype, self.offset)

    def to_host(self) -> np.ndarray:
        """A new NumPy array with a copy of the values."""
        return self.buffer.copy_to_host(np.empty(self.shape, self.dtype), self.offset)

    def write(self, values) -> None:
        """Overwrite every value with `values` (broadcast to the shape)."""
        host = np.ascontiguousarray(np.broadcast_to(np.asarray(values, self.dtype), self.shape))
        self.buffer.copy_from_host(host, self.offset)

    def zero(self) -> None:
        if self.nbytes:
            primary_context(self.ordinal)
            _check(_driver().cuMemsetD8(self.ptr, 0, self.nbytes), "cuMemsetD8")

    def copy_bytes_from(self, src: "DeviceMemory", dest_offset: int, src_offset: int, nbytes: int) -> None:
        """Copy `nbytes` from `src` (at byte `src_offset` of it) to byte `dest_offset` of this."""
        self.buffer.copy_from(src.buffer, nbytes, self.offset + dest_offset, src.offset + src_offset)

    def cuda_array_interface(self, readonly: bool = False) -> dict:
        return cuda_array_interface(self.ptr, self.shape, self.dtype, readonly=readonly)
