"""Device -> host copies that leave the host free: snapshots of GPU states for the disk tier.

A plain copy (cuMemcpyDtoH) waits for every kernel queued before it: the host that asked for a
snapshot idles until the GPU drains, then the GPU idles until the host queues more. `HostCopy`
instead copies into page-locked (pinned) host memory on a stream of its own, behind an event
recorded where the kernels run, and returns at once; the host asks later whether the copy is done
(`done`) or waits for it (`wait`), and hands the pinned memory back (`release`) for the next copy.
Pinned memory is pooled by size for the life of the process: page-locking is slow, and a run
writes snapshots of the same sizes again and again.

    copy = HostCopy({"u": u, "v": v})       # u, v: arrays on one GPU; they must not change until done
    ...                                    # queue more launches
    values = copy.wait()                   # {"u": ndarray, "v": ndarray}: views of pinned memory
    storage.write(n, values)               # HDF5Storage copies them
    copy.release()                         # the views are invalid from here on

The arrays' memory must stay as it is until the copy is done: the caller holds it (the stepper
keeps the state's versions out of its pool until then).
"""
from __future__ import annotations

import ctypes
import threading
from collections import defaultdict
from typing import Mapping

import numpy as np

from ..backends.cuda_driver import _check, _driver, primary_context

__all__ = ["HostCopy"]

_lock = threading.Lock()
_side_streams: dict[int, object] = {}                       # ordinal -> its copy stream
_free_pinned: dict[tuple[int, int], list[int]] = defaultdict(list)     # (ordinal, nbytes) -> host pointers


def _side_stream(ordinal: int):
    """The device's copy stream: non-blocking, so it never waits for the legacy stream's later work."""
    with _lock:
        stream = _side_streams.get(ordinal)
        if stream is None:
            stream = _side_streams[ordinal] = _check(_driver().cuStreamCreate(1), "cuStreamCreate")
    return stream


def _take_pinned(ordinal: int, nbytes: int) -> int:
    with _lock:
        free = _free_pinned[ordinal, nbytes]
        if free:
            return free.pop()
    try:
        return int(_check(_driver().cuMemHostAlloc(nbytes, 0), f"cuMemHostAlloc({nbytes})"))
    except Exception as e:
        raise MemoryError(f"HostCopy: could not allocate {nbytes} bytes of page-locked host memory for a "
                          f"snapshot of a cuda:{ordinal} state ({e}); free host memory or keep fewer "
                          "snapshots in flight") from None


class HostCopy:
    """An asynchronous copy of device arrays (all on one GPU) into pinned host memory."""

    def __init__(self, arrays: Mapping[str, object]):
        memories = {name: a._data for name, a in arrays.items()}
        ordinals = {m.ordinal for m in memories.values()}
        if len(ordinals) != 1:
            raise ValueError(f"HostCopy: the arrays must be on one GPU, got cuda:{sorted(ordinals)}")
        self.ordinal = ordinals.pop()
        driver = _driver()
        primary_context(self.ordinal)
        stream = _side_stream(self.ordinal)
        self._pinned: list[tuple[int, int]] = []
        self._values: dict[str, np.ndarray] = {}
        ready = _check(driver.cuEventCreate(0), "cuEventCreate")
        _check(driver.cuEventRecord(ready, driver.CUstream(0)), "cuEventRecord")   # after the kernels queued so far
        _check(driver.cuStreamWaitEvent(stream, ready, 0), "cuStreamWaitEvent")
        for name, memory in memories.items():
            nbytes = max(memory.nbytes, 1)
            host = _take_pinned(self.ordinal, nbytes)
            self._pinned.append((host, nbytes))
            if memory.nbytes:
                _check(driver.cuMemcpyDtoHAsync(host, memory.ptr, memory.nbytes, stream), "cuMemcpyDtoHAsync")
            self._values[name] = _view(host, memory.shape, memory.dtype)
        self._done = _check(driver.cuEventCreate(0), "cuEventCreate")
        _check(driver.cuEventRecord(self._done, stream), "cuEventRecord")
        _check(driver.cuEventDestroy(ready), "cuEventDestroy")

    def done(self) -> bool:
        """True once the copy has finished; never waits."""
        driver = _driver()
        primary_context(self.ordinal)
        result = driver.cuEventQuery(self._done)
        if int(result[0]) == int(driver.CUresult.CUDA_ERROR_NOT_READY):
            return False
        _check(result, "cuEventQuery")      # a failed kernel or copy raises here
        return True

    def wait(self) -> dict[str, np.ndarray]:
        """The copied values once the copy has finished: views of pinned memory, valid until `release`."""
        primary_context(self.ordinal)
        _check(_driver().cuEventSynchronize(self._done), "cuEventSynchronize")
        return self._values

    def release(self) -> None:
        """Hand the pinned memory back for later copies (waits for the copy first)."""
        if not self._pinned:
            return
        self.wait()
        _check(_driver().cuEventDestroy(self._done), "cuEventDestroy")
        with _lock:
            for host, nbytes in self._pinned:
                _free_pinned[self.ordinal, nbytes].append(host)
        self._pinned, self._values = [], {}


def _view(ptr: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A NumPy array over `shape` values of `dtype` at host address `ptr` (memory it does not own)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    buffer = (ctypes.c_char * max(count * dtype.itemsize, 1)).from_address(ptr)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
