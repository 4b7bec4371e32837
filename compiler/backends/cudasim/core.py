"""The fake driver's shared state and the calls every other part builds on: result codes, handles,
contexts and devices, the capture and late-stream machinery (`_run_or_capture`, `_catch_up`).

driver.py (memory, modules, launches) and streams.py (streams, events, graphs) both build on this
module; driver.py is the one module `compiler.backends.cuda_driver` loads, and it re-exports the calls
defined here and in streams.py. See driver.py's docstring for what the fake checks.
"""
from __future__ import annotations

import bisect
import collections
import ctypes
import enum
import itertools
import threading
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "IMAGE_MAGIC", "DEVICES", "SM_COUNT", "COMPUTE_CAPABILITY", "TOTAL_MEMORY", "DRIVER_VERSION",
    "CUresult", "CUdevice_attribute", "CUpointer_attribute", "CUstreamCaptureMode", "CUcontext", "CUdevice",
    "CUstream", "CUmodule", "CUfunction", "CUevent", "CUgraph", "CUgraphExec", "recent_launches",
    "cuThreadExchangeStreamCaptureMode", "cuGetErrorName", "cuGetErrorString", "cuInit", "cuDriverGetVersion",
    "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
    "cuCtxSynchronize",
]
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
    call.__name__, call.__wrapped__ = fn.__name__, fn      # __wrapped__: inspect.signature sees fn's parameters
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
