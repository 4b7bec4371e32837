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
import collections
import ctypes
import enum
import itertools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

IMAGE_MAGIC = b"stepper-cudasim-image\0"
DEVICES = 2                       # two devices, so that context switches are exercised
SM_COUNT = 2                      # few SMs: launches of more than 2*32*256 threads loop grid-stride
COMPUTE_CAPABILITY = (9, 0)
TOTAL_MEMORY = 8 << 30            # per device
DRIVER_VERSION = 13000


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_LAUNCH_FAILED = 719
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class CUpointer_attribute(enum.IntEnum):
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class CUstreamCaptureMode(enum.IntEnum):
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
    CU_STREAM_CAPTURE_MODE_RELAXED = 2


_DESCRIPTIONS = {
    CUresult.CUDA_SUCCESS: "no error",
    CUresult.CUDA_ERROR_INVALID_VALUE: "invalid argument",
    CUresult.CUDA_ERROR_OUT_OF_MEMORY: "out of memory",
    CUresult.CUDA_ERROR_NOT_INITIALIZED: "initialization error",
    CUresult.CUDA_ERROR_INVALID_DEVICE: "invalid device ordinal",
    CUresult.CUDA_ERROR_INVALID_IMAGE: "device kernel image is invalid",
    CUresult.CUDA_ERROR_INVALID_CONTEXT: "invalid device context",
    CUresult.CUDA_ERROR_INVALID_HANDLE: "invalid resource handle",
    CUresult.CUDA_ERROR_NOT_FOUND: "named symbol not found",
    CUresult.CUDA_ERROR_NOT_READY: "device not ready",
    CUresult.CUDA_ERROR_LAUNCH_FAILED: "unspecified launch failure",
    CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "operation not permitted when stream is capturing",
    CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "operation failed due to a previous error during capture",
    CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: "operation would make the legacy stream depend on a capturing "
                                                 "blocking stream",
}

_OK = CUresult.CUDA_SUCCESS


class _Fail(Exception):
    def __init__(self, code: CUresult):
        self.code = code


def _api(fn):
    """A driver entry point: returns (CUresult, *values); failures come back as codes, never raise."""
    def call(*args):
        try:
            out = fn(*args)
        except _Fail as f:
            return (f.code,)
        return (_OK,) if out is None else (_OK, *out) if isinstance(out, tuple) else (_OK, out)
    call.__name__ = fn.__name__
    return call


# -- state --------------------------------------------------------------------------------------------
@dataclass(eq=False)
class CUcontext:
    ordinal: int
    error: CUresult = _OK          # sticky: set by a failed kernel, returned by every later call


class CUdevice(int):
    pass


class CUstream:
    _ids = itertools.count(1)

    def __init__(self, value=0, flags=0):
        self.value, self.flags = int(value), int(flags)
        self.capture: CUgraph | None = None
        self.capture_mode = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        self.capture_thread = 0
        self.context: CUcontext | None = None
        self.queued: collections.deque = collections.deque()     # work a non-blocking stream runs late

    @property
    def runs_late(self) -> bool:
        return bool(self.flags & 1) and self.capture is None

    def __int__(self):
        return self.value


@dataclass(eq=False)
class CUmodule:
    lib: ctypes.CDLL
    context: CUcontext
    path: str


@dataclass(eq=False)
class CUfunction:
    module: CUmodule
    name: str
    run: object
    sizes: list


@dataclass(eq=False)
class CUevent:
    stream: CUstream | None = None     # the late stream it is queued on; None once it has happened
    done: bool = True


@dataclass(eq=False)
class CUgraph:
    nodes: list = field(default_factory=list)      # callables, run in order


@dataclass(eq=False)
class CUgraphExec:
    nodes: list
    context: CUcontext
    destroyed: bool = False


_lock = threading.RLock()
_initialized = False
_primary: dict[int, CUcontext] = {}
_current = threading.local()
_allocations: dict[int, tuple[int, np.ndarray, CUcontext]] = {}   # start -> (nbytes, memory, context)
_starts: list[int] = []                                              # sorted keys of _allocations
_streams: dict[int, CUstream] = {}
_pinned: dict[int, tuple[int, np.ndarray]] = {}                    # page-locked host memory: start -> (nbytes, memory)
_launches = itertools.count(1)
# (entry name, grid, block, stream) of the latest launches and graph launches, for tests to inspect.
recent_launches: collections.deque = collections.deque(maxlen=256)


def _context() -> CUcontext:
    if not _initialized:
        raise _Fail(CUresult.CUDA_ERROR_NOT_INITIALIZED)
    ctx = getattr(_current, "context", None)
    if ctx is None:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_CONTEXT)
    if ctx.error != _OK:
        raise _Fail(ctx.error)
    return ctx


def _device_range(ptr: int, nbytes: int) -> tuple[int, np.ndarray, CUcontext]:
    """The allocation holding [ptr, ptr + nbytes), or CUDA_ERROR_INVALID_VALUE."""
    ptr = int(ptr)
    with _lock:
        k = bisect.bisect_right(_starts, ptr) - 1
        if k >= 0:
            start = _starts[k]
            size, memory, ctx = _allocations[start]
            if ptr + nbytes <= start + size:
                return start, memory, ctx
    raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)


def _host_range(ptr: int, nbytes: int) -> None:
    ptr = int(ptr)
    with _lock:
        k = bisect.bisect_left(_starts, ptr + nbytes) - 1      # the last allocation starting before the end
        if k >= 0 and ptr < _starts[k] + _allocations[_starts[k]][0]:
            raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)     # a device pointer where a host one belongs


def _stream(stream) -> CUstream | None:
    """The stream object for a handle (None: the legacy default stream)."""
    value = int(stream) if stream is not None else 0
    if value == 0:
        return None
    s = _streams.get(value)
    if s is None:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_HANDLE)
    return s


def _no_capture_on_legacy() -> None:
    """Synchronous calls use the legacy stream, which may not depend on a capturing blocking stream
    (a stream created with flags 0; CU_STREAM_NON_BLOCKING = 1 is exempt)."""
    if any(s.capture is not None and not s.flags & 1 for s in _streams.values()):
        raise _Fail(CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)


_thread_mode = threading.local()       # each thread's capture interaction mode (default: global)


def _no_unsafe_call_during_capture() -> None:
    """An unsafe call (one a capture does not observe, such as cuMemAlloc) while the calling thread
    captures, or any thread captures in global mode, unless this thread's mode is relaxed."""
    mode = getattr(_thread_mode, "mode", CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    if mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED:
        return
    me = threading.get_ident()
    for s in _streams.values():
        if s.capture is not None and s.capture_mode != CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED and (
                s.capture_thread == me or s.capture_mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
                and mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL):
            raise _Fail(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)


@_api
def cuThreadExchangeStreamCaptureMode(mode):
    previous = getattr(_thread_mode, "mode", CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    _thread_mode.mode = CUstreamCaptureMode(int(mode))
    return previous


def _run_or_capture(stream, node) -> None:
    s = _stream(stream)
    if s is not None and s.capture is not None:
        s.capture.nodes.append(node)
    elif s is not None and s.runs_late:
        s.queued.append(node)
    else:
        _no_capture_on_legacy()
        node()


def _catch_up(stream: CUstream, until: CUevent | None = None) -> None:
    """Run what `stream` has queued, up to and including the record of `until` (all of it: None)."""
    while stream.queued and not (until is not None and until.done):
        stream.queued.popleft()()


def _catch_up_all() -> None:
    for s in list(_streams.values()):
        _catch_up(s)


# -- errors, init, devices, contexts -------------------------------------------------------------------
def cuGetErrorName(err):
    code = CUresult(int(err))
    return _OK, code.name.encode()


def cuGetErrorString(err):
    return _OK, _DESCRIPTIONS.get(CUresult(int(err)), "unknown error").encode()


@_api
def cuInit(flags):
    global _initialized
    _initialized = True


@_api
def cuDriverGetVersion():
    return DRIVER_VERSION


@_api
def cuDeviceGetCount():
    if not _initialized:
        raise _Fail(CUresult.CUDA_ERROR_NOT_INITIALIZED)
    return DEVICES


@_api
def cuDeviceGet(ordinal):
    if not _initialized:
        raise _Fail(CUresult.CUDA_ERROR_NOT_INITIALIZED)
    if not 0 <= int(ordinal) < DEVICES:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_DEVICE)
    return CUdevice(ordinal)


@_api
def cuDeviceGetAttribute(attr, dev):
    values = {CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: SM_COUNT,
              CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: COMPUTE_CAPABILITY[0],
              CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: COMPUTE_CAPABILITY[1]}
    if attr not in values:
        raise _Fail(CUresult.CUDA_ERROR_INVALID_VALUE)
    return values[attr]


@_api
def cuDevicePrimaryCtxRetain(dev):
    with _lock:
        return _primary.setdefault(int(dev), CUcontext(int(dev)))


@_api
def cuCtxSetCurrent(ctx):
    _current.context = ctx


@_api
def cuCtxSynchronize():
    _context()
    _no_capture_on_legacy()
    _catch_up_all()


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


# -- streams, events and graphs: in streams.py (which imports what it needs from here) ----------------
from .streams import *  # noqa: E402,F401,F403


def __getattr__(name: str):
    raise AttributeError(f"the CUDA simulator does not implement the driver call {name!r}: add it to "
                         f"compiler/backends/cudasim/driver.py (with the checks a real driver makes) before "
                         f"using it")
