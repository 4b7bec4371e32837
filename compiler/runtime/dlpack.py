"""DLPack for GPU arrays: hand device memory to JAX, PyTorch or CuPy and take theirs, without copies.

A CPU array's `__dlpack__` is its ndarray's (NumPy implements the protocol); this module does the
same for device memory with the protocol's C structs (dlpack.h, version 0.8 ABI):

    capsule = to_dlpack(memory)          # a "dltensor" PyCapsule owning a reference to `memory`
    memory, device = adopt(obj)          # DeviceMemory sharing obj's memory (freed through its deleter)
    x = stepper.from_dlpack(obj)         # the same as an array (runtime/array.py)

The producer keeps the memory alive until the consumer calls the tensor's deleter (or, if nobody
consumed it, until the capsule dies). Work is ordered on the legacy default stream (stream 1 in the
protocol), which is where every launch and copy of ours goes, so no stream synchronisation is needed.
"""
from __future__ import annotations

import ctypes

import numpy as np

from .cuda_array import DeviceBuffer, DeviceMemory

__all__ = ["to_dlpack", "adopt"]

KDL_CPU, KDL_CUDA = 1, 2
_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_exported: dict[int, tuple] = {}     # address of a DLManagedTensor -> what must live until its deleter


@_DELETER
def _delete(managed) -> None:
    _exported.pop(ctypes.addressof(managed.contents), None)


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    # An unconsumed capsule still owns its tensor; a consumed one was renamed "used_dltensor".
    obj = ctypes.cast(capsule, ctypes.py_object)
    if _api.PyCapsule_IsValid(obj, b"dltensor"):
        address = _api.PyCapsule_GetPointer(obj, b"dltensor")
        _exported.pop(address, None)


def to_dlpack(memory, stream=None):
    """A "dltensor" capsule for `memory` (a DeviceMemory); the capsule's tensor keeps it alive."""
    dtype = np.dtype(memory.dtype)
    shape = (ctypes.c_int64 * max(memory.ndim, 1))(*memory.shape)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(ctypes.c_void_p(memory.ptr), DLDevice(KDL_CUDA, memory.ordinal), memory.ndim,
                                 DLDataType(_CODES[dtype.kind], dtype.itemsize * 8, 1), shape, None, 0)
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    _exported[address] = (managed, shape, memory)
    return _api.PyCapsule_New(address, b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))


class _Owner:
    """Calls the producer's deleter when the adopted memory is no longer used."""

    def __init__(self, managed):
        self.managed = managed

    def __del__(self):
        if self.managed.contents.deleter:
            self.managed.contents.deleter(self.managed)


def adopt(obj):
    """(DeviceMemory sharing `obj`'s GPU memory, device string), or (ndarray, "cpu") for host data."""
    kind, ordinal = obj.__dlpack_device__()
    if kind == KDL_CPU:
        return np.from_dlpack(obj), "cpu"
    if kind != KDL_CUDA:
        raise ValueError(f"from_dlpack: data on DLPack device type {kind} is neither the CPU (1) nor CUDA (2)")
    capsule = obj.__dlpack__(stream=1)
    address = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = ctypes.cast(address, ctypes.POINTER(DLManagedTensor))
    t = managed.contents.dl_tensor
    codes = {v: k for k, v in _CODES.items()}
    if t.dtype.lanes != 1 or t.dtype.code not in codes:
        raise ValueError(f"from_dlpack: unsupported element type (code {t.dtype.code}, {t.dtype.bits} bits, "
                         f"{t.dtype.lanes} lanes)")
    dtype = np.dtype(f"{codes[t.dtype.code]}{t.dtype.bits // 8}")
    shape = tuple(t.shape[k] for k in range(t.ndim))
    contiguous = DeviceMemory(None, shape, dtype).strides
    if t.strides and tuple(t.strides[k] * dtype.itemsize for k in range(t.ndim)) != contiguous \
            and int(np.prod(shape)) > 1:
        raise ValueError("from_dlpack: the GPU array is not C-contiguous; make it contiguous first")
    _api.PyCapsule_SetName(capsule, b"used_dltensor")       # we own the tensor now
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = DeviceBuffer(nbytes, t.device.device_id, ptr=t.data + t.byte_offset, owner=_Owner(managed))
    return DeviceMemory(buffer, shape, dtype), f"cuda:{t.device.device_id}"
