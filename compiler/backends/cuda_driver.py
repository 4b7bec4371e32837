"""Load and launch steps of the CUDA backend: thin wrappers over the CUDA driver API (cuda-bindings).

    if cuda_available():
        major, minor = device_arch(0)
        image = compile_cuda(source, "k", arch=f"sm_{major}{minor}", output="cubin")
        module = load_module(image, device=0)
        launch(get_function(module, "k"), grid=blocks, block=256,
               args=[ctypes.c_uint64(ptr), ctypes.c_int32(n)])

Prefer CUBIN for the device's own ``sm_XY``: PTX from a newer NVRTC than the driver needs a newer
driver to JIT (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). Modules are loaded into the device's primary
context, which is made current on the calling thread.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any, Sequence

__all__ = ["CudaError", "cuda_available", "device_count", "device_arch", "primary_context",
           "load_module", "get_function", "launch", "synchronize"]


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


@functools.cache
def _driver():
    """The CUDA driver API: cuda-bindings', or the simulator's fake under STEPPER_CUDA_SIM=1. Chosen
    once per process (a context, an allocation or a module of one is meaningless to the other), and
    cached: it is called several times a launch, and reading the environment each time cost ~1.7 us
    a call on an H100 host, against ~23 us for a whole launch."""
    from . import cudasim
    if cudasim.enabled():
        from .cudasim import driver
        return driver
    from cuda.bindings import driver
    return driver


# Errors a failed kernel leaves in its context: every later call reports them, so the call that
# raises is rarely the culprit.
_LAUNCH_FAILURES = {"CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT"}
_LAUNCH_FAILURE_HINT = (" (a kernel launched earlier failed, and the GPU context is unusable from now on; run with "
                        "STEPPER_CUDA_SYNC=1 to wait for each launch and name the kernel that failed, and "
                        "debug=True launches to check its indices)")


def _check(result: tuple, what: str) -> Any:
    """Unpack a cuda-bindings ``(error, *values)`` tuple, raising :class:`CudaError` on an error."""
    err, *values = result
    if int(err) != 0:
        driver = _driver()
        name = driver.cuGetErrorName(err)[1]
        text = driver.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(err)
        text = text.decode() if isinstance(text, bytes) else ""
        hint = _LAUNCH_FAILURE_HINT if name in _LAUNCH_FAILURES else ""
        raise CudaError(f"{what} failed: {name}: {text}{hint}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def _init() -> None:
    _check(_driver().cuInit(0), "cuInit")


@functools.cache
def cuda_available() -> bool:
    """True when the CUDA driver loads, initializes and sees at least one GPU; never raises."""
    try:
        return device_count() > 0
    except Exception:   # no cuda-bindings, no libcuda, no device, a broken driver: all mean "no"
        return False


def device_count() -> int:
    """Number of CUDA devices (raises :class:`CudaError` without a working driver)."""
    _init()
    return int(_check(_driver().cuDeviceGetCount(), "cuDeviceGetCount"))


def device_arch(ordinal: int = 0) -> tuple[int, int]:
    """The compute capability of device ``ordinal``, e.g. (9, 0) for an H100."""
    driver = _driver()
    _init()
    dev = _check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
    attr = driver.CUdevice_attribute
    major = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                   "cuDeviceGetAttribute")
    minor = _check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                   "cuDeviceGetAttribute")
    return int(major), int(minor)


_contexts: dict[int, Any] = {}
_lock = threading.Lock()


def primary_context(ordinal: int = 0):
    """Retain device ``ordinal``'s primary context (once per process) and make it current here."""
    driver = _driver()
    ctx = _contexts.get(ordinal)          # every launch asks: no lock once retained
    if ctx is None:
        with _lock:
            ctx = _contexts.get(ordinal)
            if ctx is None:
                _init()
                dev = _check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
                ctx = _contexts[ordinal] = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def load_module(image: bytes, device: int = 0):
    """Load a PTX or CUBIN image (from :func:`compile_cuda`) on ``device``; returns a CUmodule."""
    primary_context(device)
    if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
        image = image + b"\0"           # the driver reads PTX as a NUL-terminated string
    return _check(_driver().cuModuleLoadData(image), "cuModuleLoadData")


def get_function(module, name: str):
    """The kernel ``name`` (an ``extern "C"`` name) in ``module``; returns a CUfunction."""
    return _check(_driver().cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name!r})")


def launch(function, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
           stream=None, shared_mem: int = 0) -> None:
    """Launch ``function`` asynchronously on ``stream`` (default: the legacy default stream).

    ``args`` holds one ctypes value per kernel parameter, of the parameter's exact C type and layout
    (``ctypes.c_float(1.0)``, ``ctypes.c_void_p(device_ptr)``, a ``ctypes.Structure``), or NumPy
    scalars (``np.float32(1.0)``), whose dtype gives the type. The driver copies the values at launch,
    so they may be dropped as soon as this returns.
    """
    keep_alive = [_as_ctypes(a) for a in args]
    params = (ctypes.c_void_p * max(len(keep_alive), 1))(*(ctypes.addressof(a) for a in keep_alive))
    gx, gy, gz = _dim3(grid, "grid")
    bx, by, bz = _dim3(block, "block")
    driver = _driver()
    if stream is None or isinstance(stream, int):
        stream = _legacy_stream() if not stream else driver.CUstream(stream)
    _check(driver.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared_mem, stream,
                                 ctypes.addressof(params), 0), "cuLaunchKernel")


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. (12, 4)."""
    _init()
    v = int(_check(_driver().cuDriverGetVersion(), "cuDriverGetVersion"))
    return v // 1000, (v % 1000) // 10


def check_toolkit(driver: tuple[int, int], nvrtc: tuple[int, int]) -> None:
    """Raise CudaError when kernels NVRTC `nvrtc` builds cannot load on a driver for CUDA `driver`
    (a newer major version than the driver's); the message names both and how to fix it."""
    if nvrtc[0] > driver[0]:
        raise CudaError(
            f"NVRTC {nvrtc[0]}.{nvrtc[1]} builds kernels for CUDA {nvrtc[0]}, but the NVIDIA driver supports CUDA "
            f"{driver[0]}.{driver[1]} only, so it could not load them. Install the NVRTC of the driver's CUDA "
            f"(pip install 'nvidia-cuda-nvrtc-cu{driver[0]}' 'cuda-python=={driver[0]}.*') or update the driver.")


@contextlib.contextmanager
def relaxed_capture():
    """Lets the calling thread make calls a stream capture does not observe (cuMemAlloc) while it
    captures: memory that every replay of the graph uses, allocated once, outside the graph."""
    driver = _driver()
    previous = _check(driver.cuThreadExchangeStreamCaptureMode(
        driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        _check(driver.cuThreadExchangeStreamCaptureMode(previous), "cuThreadExchangeStreamCaptureMode")


def synchronize(device: int = 0) -> None:
    """Wait for all work on ``device``'s primary context (raises errors from earlier launches)."""
    primary_context(device)
    _check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")


def _as_ctypes(value):
    if isinstance(value, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return value
    import numpy as np
    if isinstance(value, np.generic):
        # The driver copies parameters bytewise, so a byte buffer of the value's bytes will do.
        return (ctypes.c_char * value.nbytes).from_buffer_copy(value.tobytes())
    raise TypeError(
        f"kernel arguments must be ctypes values or NumPy scalars of the parameter's exact type "
        f"(e.g. ctypes.c_int32(n), np.float32(x)), not {type(value).__name__}")


@functools.cache
def _legacy_stream():
    return _driver().CUstream(0)


def _dim3(dim: int | Sequence[int], what: str) -> tuple[int, int, int]:
    if type(dim) is int and dim >= 1:
        return dim, 1, 1
    dims = (dim,) if isinstance(dim, int) else tuple(int(d) for d in dim)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, not {dim!r}")
    return dims + (1,) * (3 - len(dims))
