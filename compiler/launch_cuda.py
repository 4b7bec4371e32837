"""Launch step of the CUDA backend: run a kernel's forward or adjoint entry on a GPU.

`launch.py` checks and packs the arguments exactly as for the CPU and calls here when the device is
a GPU. Written carefully but not yet run on a GPU (no machine with one was available).

- Launches go to the legacy default stream and are asynchronous, except in debug mode, where the
  bounds-check result is read back after each launch (a synchronising copy).
- The packed argument buffer is passed by value (see codegen/targets.py): no device allocation and
  no copy per launch beyond the driver's parameter copy.
- Deterministic (serial) launches run one block of one thread, so float atomics accumulate in
  thread-index order, as on the CPU; that is slow and meant for exact comparisons only.
- The adjoint's loop tape is measured first (count_only pass; the maximum words per thread lands in
  the device global `sp_tape_words`), then allocated interleaved (word w of thread t at
  `w * n + t`) so that consecutive threads touch consecutive addresses.
"""
from __future__ import annotations

import ctypes
import functools

from .backends import cuda_driver
from .codegen.targets import CUDA_BLOCK_SIZE
from .cuda_module import cuda_module
from .runtime.cuda_array import DeviceBuffer
from .runtime.device import get_device

BLOCKS_PER_SM = 32       # enough resident blocks to hide latency; the grid-stride loop does the rest


@functools.cache
def _sm_count(ordinal: int) -> int:
    driver = cuda_driver._driver()
    dev = cuda_driver._check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(cuda_driver._check(driver.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))


def _grid(n: int, serial: bool, ordinal: int) -> tuple[int, int]:
    if serial:
        return 1, 1
    blocks = (n + CUDA_BLOCK_SIZE - 1) // CUDA_BLOCK_SIZE
    return max(1, min(blocks, _sm_count(ordinal) * BLOCKS_PER_SM)), CUDA_BLOCK_SIZE


def _by_value(buffer: bytes):
    return (ctypes.c_char * len(buffer)).from_buffer_copy(buffer)


class _DeviceScalar:
    """`.value` reads/writes a device global, so launch._raise_if_out_of_bounds works unchanged."""

    def __init__(self, loaded, name, ctype):
        self.loaded, self.name, self.ctype = loaded, name, ctype

    @property
    def value(self):
        return self.loaded.read(self.name, self.ctype).value

    @value.setter
    def value(self, v):
        self.loaded.write(self.name, self.ctype(v))


class _ErrorView:
    """The loaded module seen through the attributes launch._raise_if_out_of_bounds reads."""

    def __init__(self, loaded):
        self.sites = loaded.sites
        self.error_site = _DeviceScalar(loaded, "sp_error_site", ctypes.c_int)
        self._loaded = loaded

    @property
    def error_index(self):
        return list(self._loaded.read("sp_error_index", ctypes.c_longlong * 4))


def _check_bounds(loaded, kernel) -> None:
    from .launch import _raise_if_out_of_bounds
    _raise_if_out_of_bounds(_ErrorView(loaded), kernel)


def forward(kernel, compiled, buffer: bytes, n: int, debug: bool, serial: bool, device: str) -> None:
    """Run the forward entry of `kernel` over `n` threads on `device` (asynchronous unless debug)."""
    dev = get_device(device)
    loaded = cuda_module(kernel.module, debug, dev)
    if n == 0:
        return
    grid, block = _grid(n, serial, dev.ordinal)
    cuda_driver.launch(loaded.function(compiled.forward.name, adjoint=False), grid, block, [_by_value(buffer)])
    if debug:
        _check_bounds(loaded, kernel)


def adjoint(kernel, compiled, buffer: bytes, adj_buffer: bytes, n: int, debug: bool, serial: bool,
            device: str) -> None:
    """Run the adjoint entry of `kernel` (gradients accumulate into the arrays in `adj_buffer`)."""
    dev = get_device(device)
    loaded = cuda_module(kernel.module, debug, dev)
    if n == 0:
        return
    fn = loaded.function(compiled.adjoint.name, adjoint=True)
    grid, block = _grid(n, serial, dev.ordinal)
    args, adj = _by_value(buffer), _by_value(adj_buffer)
    tape, capacity = None, 0
    if compiled.needs_tape:
        loaded.write("sp_tape_words", ctypes.c_ulonglong(0))
        cuda_driver.launch(fn, grid, block, [args, adj, ctypes.c_void_p(0), ctypes.c_int64(0), ctypes.c_int(1),
                                             ctypes.c_void_p(0)])
        capacity = loaded.read("sp_tape_words", ctypes.c_ulonglong).value     # waits for the counting pass
        if capacity:
            try:
                tape = DeviceBuffer(capacity * n * 8, dev.ordinal)
            except cuda_driver.CudaError as e:
                raise MemoryError(f"{compiled.forward.loc}: the adjoint of kernel '{kernel.__name__}' needs "
                                  f"{capacity * n * 8 / 2**20:.1f} MiB of GPU memory for the values its loops carry "
                                  f"({capacity} words per thread x {n} threads) and could not allocate it ({e})") from None
        loaded.write("sp_tape_overflow", ctypes.c_int(0))
    cuda_driver.launch(fn, grid, block, [args, adj, ctypes.c_void_p(tape.ptr if tape else 0),
                                         ctypes.c_int64(capacity), ctypes.c_int(0), ctypes.c_void_p(0)])
    if debug:
        _check_bounds(loaded, kernel)
    if compiled.needs_tape:
        overflow = loaded.read("sp_tape_overflow", ctypes.c_int).value   # synchronises: the tape may be freed
        if overflow:
            raise RuntimeError(f"internal error: the adjoint of kernel '{kernel.__name__}' overflowed its measured "
                               f"tape ({capacity} words per thread); please report this with the kernel's source")
