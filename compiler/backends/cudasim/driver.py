"""A strict host-memory fake of the CUDA driver calls the project makes, for the CUDA simulator.

It answers the same calls as ``cuda.bindings.driver`` with the same conventions (each returns
``(CUresult, *values)``), so `compiler.backends.cuda_driver` uses it unchanged. What it checks, as
a real driver would, so that the bugs a first GPU run would show surface here instead:

- a current context on the calling thread for every call that needs one (a launch from a thread
  that never made one current fails with CUDA_ERROR_INVALID_CONTEXT), and functions used only in
  the context their module was loaded into;
- every device range of a copy or memset inside one live allocation, and host ranges outside
  device memory (swapped arguments fail);
- fresh allocations hold garbage (0xFF bytes: NaN for floats), so a missing zero-fill shows;
- a kernel that traps poisons the context: the launch itself succeeds (launches are asynchronous)
  and every later call returns CUDA_ERROR_LAUNCH_FAILED, as on a GPU;
- during stream capture, launches on the capturing stream are recorded, and a synchronous call
  on the legacy stream is an error while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  cuMemAlloc is an unsafe call while the calling thread captures (or any thread captures in global
  mode) unless the thread swapped its mode to relaxed (cuThreadExchangeStreamCaptureMode):
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
- work on a non-blocking stream runs late: it waits until someone waits for it (an event or stream
  synchronize, a stream that waits on its event, a context synchronize, a free), so memory reused
  before such a wait shows up as wrong data, as it would on a busy GPU; a query of an event
  still queued there says CUDA_ERROR_NOT_READY;
- asynchronous copies to the host need page-locked memory (cuMemHostAlloc): a real driver would
  quietly make a copy to pageable memory synchronous, which is never what async code means.

Any call it does not implement raises AttributeError naming it: nothing is silently a no-op.
Everything else runs synchronously, in the calling thread.
"""
from __future__ import annotations

import bisect
import ctypes
import os
from pathlib import Path

import numpy as np

# This module is the whole fake driver: it re-exports the calls and handles of core.py and streams.py.
from .core import *  # noqa: F401,F403
from .core import (IMAGE_MAGIC, TOTAL_MEMORY, CUfunction, CUmodule, CUpointer_attribute, CUresult, _Fail,
                   _allocations, _api, _catch_up_all, _context, _device_range, _host_range, _launches, _lock,
                   _no_unsafe_call_during_capture, _pinned, _run_or_capture, _starts, recent_launches)
from .streams import *  # noqa: F401,F403


# -- memory --------------------------------------------------------------------------------------------
@_api
def cuMemAlloc(nbytes):
    ctx = _context()
    _no_unsafe_call_during_capture()
    nbytes = int(nbytes)
    if nbytes <= 0:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    with _lock:
        used = sum(size for size, _, c in _allocations.values() if c is ctx)
        if used + nbytes > TOTAL_MEMORY:
            raise _Fail(CUresult.CUDA_ERROR_OUT_OF_MEMORY)
        memory = np.empty(nbytes + 255, np.uint8)
        start = (memory.ctypes.data + 255) // 256 * 256          # cuMemAlloc aligns to 256 bytes
        memory[start - memory.ctypes.data:][:nbytes] = 0xFF      # garbage, as fresh device memory is
        _allocations[start] = (nbytes, memory, ctx)
        bisect.insort(_starts, start)
    return start


@_api
def cuMemFree(ptr):
    _context()
    _catch_up_all()        # a free waits for the work that may still use the memory
    with _lock:
        if _allocations.pop(int(ptr), None) is None:
            raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
        _starts.remove(int(ptr))


@_api
def cuMemHostAlloc(nbytes, flags):
    _context()
    nbytes = int(nbytes)
    if nbytes <= 0:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    memory = np.full(nbytes, 0xFF, np.uint8)
    with _lock:
        _pinned[memory.ctypes.data] = (nbytes, memory)
    return memory.ctypes.data


@_api
def cuMemFreeHost(ptr):
    _context()
    _catch_up_all()
    with _lock:
        if _pinned.pop(int(ptr), None) is None:
            raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)


def _pinned_range(ptr: int, nbytes: int) -> None:
    ptr = int(ptr)
    with _lock:
        for start, (size, _) in _pinned.items():
            if start <= ptr and ptr + nbytes <= start + size:
                return
    raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)


@_api
def cuPointerGetAttribute(attr, ptr):
    if attr != CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    return _device_range(ptr, 1)[2].ordinal


def _copy(dst: int, src: int, nbytes: int, dst_device: bool, src_device: bool):
    (_device_range if dst_device else _host_range)(dst, nbytes)
    (_device_range if src_device else _host_range)(src, nbytes)
    return lambda: ctypes.memmove(int(dst), int(src), nbytes)


@_api
def cuMemcpyHtoD(dst, src, nbytes):
    _context()
    _run_or_capture(None, _copy(dst, src, int(nbytes), True, False))


@_api
def cuMemcpyDtoH(dst, src, nbytes):
    _context()
    _run_or_capture(None, _copy(dst, src, int(nbytes), False, True))


@_api
def cuMemcpyDtoHAsync(dst, src, nbytes, stream):
    _context()
    _pinned_range(dst, int(nbytes))
    _run_or_capture(stream, _copy(dst, src, int(nbytes), False, True))


@_api
def cuMemcpyDtoD(dst, src, nbytes):
    _context()
    _run_or_capture(None, _copy(dst, src, int(nbytes), True, True))


def _memset(ptr, value, nbytes):
    _device_range(ptr, int(nbytes))
    return lambda: ctypes.memset(int(ptr), int(value) & 0xFF, int(nbytes))


@_api
def cuMemsetD8(ptr, value, nbytes):
    _context()
    _run_or_capture(None, _memset(ptr, value, nbytes))


@_api
def cuMemsetD8Async(ptr, value, nbytes, stream):
    _context()
    _run_or_capture(stream, _memset(ptr, value, nbytes))


# -- modules and launches ------------------------------------------------------------------------------
def image_for(library: Path) -> bytes:
    """The image cuModuleLoadData takes in the simulator: the path of the built shared library."""
    return IMAGE_MAGIC + str(library).encode()


@_api
def cuModuleLoadData(image):
    ctx = _context()
    image = bytes(image)
    if not image.startswith(IMAGE_MAGIC):
        raise _Fail(CUresult.CUDA_ERROR_INVALID_IMAGE)     # a PTX or CUBIN: the simulator runs no GPU code
    path = image[len(IMAGE_MAGIC):].rstrip(b"\0").decode()     # load_module NUL-terminates images
    if not os.path.exists(path):
        raise _Fail(CUresult.CUDA_ERROR_INVALID_IMAGE)
    return CUmodule(ctypes.CDLL(path), ctx, path)


@_api
def cuModuleGetFunction(module, name):
    _context()
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        run, sizes = getattr(module.lib, name + "__sim"), getattr(module.lib, name + "__sim_sizes")
    except AttributeError:
        raise _Fail(CUresult.CUDA_ERROR_NOT_FOUND) from None
    run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong]
    run.restype = ctypes.c_int
    out = (ctypes.c_ulonglong * 16)()
    count = sizes(out)
    return CUfunction(module, name, run, list(out[:count]))


@_api
def cuModuleGetGlobal(module, name):
    _context()
    name = name.decode() if isinstance(name, bytes) else str(name)
    try:
        size = ctypes.c_ulonglong.in_dll(module.lib, name + "__sim_size").value
        ptr = ctypes.addressof(ctypes.c_char.in_dll(module.lib, name))
    except ValueError:
        raise _Fail(CUresult.CUDA_ERROR_NOT_FOUND) from None
    with _lock:   # a module's globals are device memory: copies to and from them are checked as such
        if ptr not in _allocations:
            _allocations[ptr] = (size, None, module.context)
            bisect.insort(_starts, ptr)
    return ptr, size


@_api
def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    ctx = _context()
    if f.module.context is not ctx:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_HANDLE)     # a function of another context's module
    grid, block = (ctypes.c_uint * 3)(gx, gy, gz), (ctypes.c_uint * 3)(bx, by, bz)
    if min(grid) < 1 or min(block) < 1 or bx * by * bz > 1024:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    # The driver copies the parameter values at launch: the caller may reuse its memory at once.
    pointers = ctypes.cast(int(params), ctypes.POINTER(ctypes.c_void_p))
    copies = [ctypes.create_string_buffer(ctypes.string_at(pointers[k], size), size)
              for k, size in enumerate(f.sizes)]
    argv = (ctypes.c_void_p * max(len(copies), 1))(*(ctypes.addressof(c) for c in copies))
    seed = int(os.environ.get("STEPPER_CUDA_SIM_SHUFFLE", "0") or 0)
    recent_launches.append((f.name, (gx, gy, gz), (bx, by, bz), int(stream) if stream is not None else 0))

    def run():
        launch_seed = seed * 1_000_003 + next(_launches) if seed else 0
        if f.run(grid, block, argv, launch_seed):
            ctx.error = CUresult.CUDA_ERROR_LAUNCH_FAILED          # reported by the next call
        run.keep = (copies, argv)
    _run_or_capture(stream, run)




def __getattr__(name: str):
    raise AttributeError(f"the CUDA simulator does not implement the driver call {name!r}: add it to "
                         f"compiler/backends/cudasim/driver.py (with the checks a real driver makes) before "
                         f"using it")
