"""Launch step of the CUDA backend: run a kernel's forward or adjoint entry on a GPU.

`launch.py` checks and packs the arguments exactly as for the CPU and calls here when the device is
a GPU. Tested on the CUDA simulator (backends/cudasim); see the README for what has run on hardware.

- Every call first makes the device's primary context current on the calling thread: a launch from
  a thread that never allocated, or after work on another device, would fail otherwise.
- Launches go to the legacy default stream and are asynchronous, except in debug mode, where the
  bounds-check result is read back after each launch (a synchronising copy), and under
  STEPPER_CUDA_SYNC=1, where each launch is waited for so a failing kernel is named.
- The packed argument buffer is passed by value (see codegen/targets.py): no device allocation and
  no copy per launch beyond the driver's parameter copy.
- Serial launches (deterministic mode, for kernels whose result depends on thread order: forwards
  with atomics, adjoints that scatter) run one block of one thread, so float atomics accumulate in
  thread-index order, as on the CPU; slow, and meant for exact comparisons only.
- Deterministic launches that add into a few elements (serial flag 2: a loss, a shared parameter's
  gradient) run a GPU thread per chunk of ADD_CHUNK threads, each summing its chunk's adds per
  element into partials in device memory, and `sp_apply_adds` then adds the partials in chunk
  order: the CPU's chunked sums, bit for bit (sp::add_slot in prelude.h), at any launch size.
- The adjoint's loop tape is measured first (count_only pass; the maximum words per thread lands in
  the device global `sp_tape_words`), then taken from a per-device buffer that only grows (never
  freed per launch: cuMemFree synchronises), interleaved (word w of thread t at `w * n + t`) so
  that consecutive threads touch consecutive addresses.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import struct
import weakref

from ..codegen.targets import ADD_CHUNK, ADD_SLOT_SIZE, CUDA_BLOCK_SIZE, LAUNCH_HEADER_SIZE
from ..errors import raise_if_out_of_bounds
from ..runtime.cuda_array import DeviceBuffer
from ..runtime.device import get_device
from . import cuda_driver, grads_variants
from .cuda_module import cuda_module

BLOCKS_PER_SM = 32       # enough resident blocks to hide latency; the grid-stride loop does the rest


@functools.cache
def _sm_count(ordinal: int) -> int:
    driver = cuda_driver._driver()
    dev = cuda_driver._check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(cuda_driver._check(driver.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))


def _grid(n: int, serial: int, ordinal: int) -> tuple[int, int]:
    if serial == 2:               # logging its adds: exactly one GPU thread per chunk (sp::thread_range)
        chunks = -(-n // ADD_CHUNK)
        return -(-chunks // CUDA_BLOCK_SIZE), CUDA_BLOCK_SIZE
    if serial:
        return 1, 1
    blocks = (n + CUDA_BLOCK_SIZE - 1) // CUDA_BLOCK_SIZE
    return max(1, min(blocks, _sm_count(ordinal) * BLOCKS_PER_SM)), CUDA_BLOCK_SIZE


_ADD_TABLES: dict[int, list[DeviceBuffer]] = {}


def _with_add_tables(buffer: bytes, n: int, add_slots: int, ordinal: int) -> tuple[bytes, int, int]:
    """`buffer` with its launch_t pointing at device memory for the partials of a launch that logs
    its adds (`add_slots` elements at most per chunk), and (that memory, the chunk count). The
    memory grows by at least half when too small; launches are ordered on one stream, so one
    buffer serves them all, and an outgrown one is kept, not freed: a captured CUDA graph may
    still point at it (and a capture may be what asks for it: the allocation is one a capture
    does not observe, made in relaxed mode)."""
    chunks = -(-n // ADD_CHUNK)
    nbytes = chunks * 8 + chunks * add_slots * ADD_SLOT_SIZE
    held = _ADD_TABLES.setdefault(ordinal, [])
    if not held or held[-1].nbytes < nbytes:
        with cuda_driver.relaxed_capture():
            held.append(DeviceBuffer(max(nbytes, int(held[-1].nbytes * 1.5) if held else 0), ordinal))
    tables = held[-1].ptr
    at = LAUNCH_HEADER_SIZE - 16                     # launch_t's adds, add_slots: its last two words
    return buffer[:at] + struct.pack("<qq", tables, add_slots) + buffer[at + 16:], tables, chunks


def _apply_adds(kernel, loaded, tables: int, chunks: int, add_slots: int, ordinal: int, stream) -> None:
    _run(kernel, loaded.function("sp_apply_adds", adjoint=True), 1, 1,
         [ctypes.c_void_p(tables), ctypes.c_int64(chunks), ctypes.c_int64(add_slots)], ordinal, stream)


def _by_value(buffer: bytes):
    return (ctypes.c_char * len(buffer)).from_buffer_copy(buffer)


@functools.cache
def _synchronous() -> bool:
    """STEPPER_CUDA_SYNC=1: wait for every launch, so an error is blamed on the kernel that made it.
    Read once per process (each read cost ~3 us, every launch)."""
    return os.environ.get("STEPPER_CUDA_SYNC", "").strip() not in ("", "0")


class _DeviceScalar:
    """`.value` reads/writes a device global, so errors.raise_if_out_of_bounds works unchanged."""

    def __init__(self, loaded, name, ctype):
        self.loaded, self.name, self.ctype = loaded, name, ctype

    @property
    def value(self):
        return self.loaded.read(self.name, self.ctype).value

    @value.setter
    def value(self, v):
        self.loaded.write(self.name, self.ctype(v))


class _ErrorView:
    """The loaded module seen through the attributes errors.raise_if_out_of_bounds reads."""

    def __init__(self, loaded):
        self.sites = loaded.sites
        self.error_site = _DeviceScalar(loaded, "sp_error_site", ctypes.c_int)
        self._loaded = loaded

    @property
    def error_index(self):
        return list(self._loaded.read("sp_error_index", ctypes.c_longlong * 4))


def _run(kernel, fn, grid: int, block: int, args: list, ordinal: int, stream=None) -> None:
    cuda_driver.launch(fn, grid, block, args, stream=stream)
    if _synchronous() and stream is None:
        try:
            cuda_driver.synchronize(ordinal)
        except cuda_driver.CudaError as e:
            raise cuda_driver.CudaError(f"kernel '{kernel.__name__}' failed on cuda:{ordinal}: {e}") from None


def _after(kernel, loaded, debug: bool) -> None:
    if debug:
        raise_if_out_of_bounds(_ErrorView(loaded), kernel)


def forward(kernel, compiled, buffer: bytes, n: int, debug: bool, serial: int, device: str, graph=None,
            add_slots: int = 0) -> None:
    """Run the forward entry of `kernel` over `n` threads on `device` (asynchronous unless debug);
    inside `capture()`, record it into the graph's CUDA graph instead. `serial` is the CPU entry's
    flag (launch.py's _serial_flag); with flag 2, `add_slots` bounds the elements it adds into."""
    dev = get_device(device)
    cuda_driver.primary_context(dev.ordinal)
    loaded = cuda_module(kernel.module, debug, dev)
    if n == 0:
        return
    grid, block = _grid(n, serial, dev.ordinal)
    stream = graph.cuda_stream(str(dev)) if graph is not None else None
    if serial == 2:
        buffer, tables, chunks = _with_add_tables(buffer, n, add_slots, dev.ordinal)
    _run(kernel, loaded.function(compiled.forward.name, adjoint=False), grid, block, [_by_value(buffer)],
         dev.ordinal, stream)
    if serial == 2:
        _apply_adds(kernel, loaded, tables, chunks, add_slots, dev.ordinal, stream)
    _after(kernel, loaded, debug)


_TAPES: dict[int, DeviceBuffer] = {}


def _tape_memory(ordinal: int, nbytes: int, kernel, compiled, capacity: int, n: int) -> DeviceBuffer:
    """The device's loop-tape buffer, grown (by at least half) when `nbytes` do not fit. Launches
    are ordered on one stream, so one buffer serves them all."""
    tape = _TAPES.get(ordinal)
    if tape is None or tape.nbytes < nbytes:
        size = max(nbytes, int(tape.nbytes * 1.5) if tape is not None else 0)
        _TAPES.pop(ordinal, None)
        try:
            tape = _TAPES[ordinal] = DeviceBuffer(size, ordinal)
        except MemoryError as e:
            raise MemoryError(f"{compiled.forward.loc}: the adjoint of kernel '{kernel.__name__}' needs "
                              f"{nbytes / 2**20:.1f} MiB of GPU memory for the values its loops carry "
                              f"({capacity} words per thread x {n} threads): {e}") from None
    return tape


_SCRATCH: dict[int, DeviceBuffer] = {}


def _scratch_memory(ordinal: int, nbytes: int, kernel) -> DeviceBuffer:
    """The device's scratch buffer for two-pass gather forms, grown (by at least half) when
    `nbytes` do not fit; launches are ordered on one stream, so one buffer serves them all."""
    scratch = _SCRATCH.get(ordinal)
    if scratch is None or scratch.nbytes < nbytes:
        size = max(nbytes, int(scratch.nbytes * 1.5) if scratch is not None else 0)
        _SCRATCH.pop(ordinal, None)
        try:
            scratch = _SCRATCH[ordinal] = DeviceBuffer(size, ordinal)
        except MemoryError as e:
            raise MemoryError(f"the adjoint of kernel '{kernel.__name__}' needs {nbytes / 2**20:.1f} MiB of GPU "
                              f"memory for the partial derivatives its two passes share: {e}") from None
    return scratch


def adjoint(kernel, compiled, function, buffer: bytes, adj_buffer: bytes, n: int, debug: bool, serial: int,
            device: str, add_slots: int = 0, grads: int | None = None, dims: tuple = ()) -> None:
    """Run the adjoint entry `function` (the adjoint or its gather form) of `kernel`: gradients
    accumulate into the arrays in `adj_buffer`. `serial` and `add_slots` as for `forward`; `grads`:
    the gradient mask of the gather form's specialised entry to run instead (except in debug mode,
    whose checks the module's entries make; see grads_variants.py). `dims`: the launch's (what a
    halo form's scratch arrays span, grown by the halo)."""
    dev = get_device(device)
    cuda_driver.primary_context(dev.ordinal)
    loaded = cuda_module(kernel.module, debug, dev)
    if n == 0:
        return
    first = None        # a two-pass form's pointwise entry, specialised with the gather entry
    if grads is not None and not debug:
        first, fn = grads_variants.cuda_functions(kernel, compiled, grads, dev)
    else:
        fn = loaded.function(function.name, adjoint=True)
    grid, block = _grid(n, serial, dev.ordinal)
    args, adj = _by_value(buffer), _by_value(adj_buffer)
    tape, capacity = 0, 0
    needs_tape = compiled.needs_tape and function is compiled.adjoint
    if needs_tape:      # the counting pass adds nothing: it runs without logging, in any order
        loaded.write("sp_tape_words", ctypes.c_ulonglong(0))
        count_grid, count_block = _grid(n, 0, dev.ordinal)
        _run(kernel, fn, count_grid, count_block, [args, adj, ctypes.c_void_p(0), ctypes.c_int64(0), ctypes.c_int(1),
                                                   ctypes.c_void_p(0)], dev.ordinal)
        capacity = loaded.read("sp_tape_words", ctypes.c_ulonglong).value     # waits for the counting pass
        if capacity:
            tape = _tape_memory(dev.ordinal, capacity * n * 8, kernel, compiled, capacity, n).ptr
        loaded.write("sp_tape_overflow", ctypes.c_int(0))
    if serial == 2:
        logging, tables, chunks = _with_add_tables(buffer, n, add_slots, dev.ordinal)
        args = _by_value(logging)
    gather = compiled.gather
    if gather is not None and function is gather.function and gather.pointwise is not None:
        # a two-pass gather form (compiler/passes/transpose.py): its pointwise pass first, into
        # scratch memory that the transposed pass reads (the stream orders the two launches)
        count = gather.scratch_elements(dims) if gather.halo else n
        tape = _scratch_memory(dev.ordinal, count * gather.scratch_bytes, kernel).ptr
        if gather.halo:         # zeros beyond the launch (GatherAdjoint.halo); the pass stores the rest
            _zero_halo(kernel, loaded, gather, dims, count, tape, dev.ordinal)
        if first is None:
            first = loaded.function(gather.pointwise.name, adjoint=True)
        _run(kernel, first, grid, block, [args, adj, ctypes.c_void_p(tape), ctypes.c_int64(0), ctypes.c_int(0),
                                          ctypes.c_void_p(0)], dev.ordinal)
        if serial == 2:     # what still scatters runs here; the next launch reuses the add tables
            _apply_adds(kernel, loaded, tables, chunks, add_slots, dev.ordinal, None)
    _run(kernel, fn, grid, block, [args, adj, ctypes.c_void_p(tape), ctypes.c_int64(capacity), ctypes.c_int(0),
                                   ctypes.c_void_p(0)], dev.ordinal)
    if serial == 2:
        _apply_adds(kernel, loaded, tables, chunks, add_slots, dev.ordinal, None)
    _after(kernel, loaded, debug)
    if needs_tape and loaded.read("sp_tape_overflow", ctypes.c_int).value:
        raise RuntimeError(f"internal error: the adjoint of kernel '{kernel.__name__}' overflowed its measured "
                           f"tape ({capacity} words per thread); please report this with the kernel's source")


# Threads a block of sp_zero_halo (targets.py): a row's two ends at an 8th-order stencil's radius, or
# a whole row outside the launch in strides of this many.
_HALO_BLOCK = 64


def _zero_halo(kernel, loaded, gather, dims: tuple, count: int, tape: int, ordinal: int) -> None:
    """Zero a halo form's scratch arrays beyond the launch over `dims` (`count` elements each, at
    `tape`): sp_zero_halo, a block per row of the grown launch's innermost axis, before the
    pointwise pass stores the rest (the stream orders them)."""
    pad, arrays = gather.halo, gather.scratch_arrays
    assert len(dims) <= 4 and len(arrays) <= 8        # sp_halo_t's room: tid()'s axes, transpose.MAX_ROOTS
    fields = [*dims, *(0,) * (4 - len(dims)), *pad, *(0,) * (4 - len(pad)),
              *(offset for offset, _ in arrays), *(0,) * (8 - len(arrays)),
              *(size for _, size in arrays), *(0,) * (8 - len(arrays)), len(dims), len(arrays), count]
    rows = math.prod(e + 2 * p for e, p in zip(dims[:-1], pad[:-1]))
    _run(kernel, loaded.function("sp_zero_halo", adjoint=True), rows, _HALO_BLOCK,
         [_by_value(struct.pack(f"<{len(fields)}q", *fields)), ctypes.c_void_p(tape)], ordinal)


def zero_async(ptr: int, nbytes: int, stream) -> None:
    """Zero `nbytes` of device memory at `ptr`, in order on `stream` (a capturing one: a graph node)."""
    if nbytes:
        cuda_driver._check(cuda_driver._driver().cuMemsetD8Async(ptr, 0, nbytes, stream), "cuMemsetD8Async")


def _destroy_exec(exec_, ordinal: int) -> None:
    try:
        cuda_driver.primary_context(ordinal)
        cuda_driver._driver().cuGraphExecDestroy(exec_)
    except Exception:       # at interpreter exit the driver may already be gone; nothing to do then
        pass


class StreamCapture:
    """A CUDA graph being captured on a stream of its own (the legacy stream cannot be captured),
    then instantiated once and launched on the legacy stream by each replay."""

    def __init__(self, device: str):
        self.ordinal = get_device(device).ordinal
        driver = cuda_driver._driver()
        cuda_driver.primary_context(self.ordinal)
        # Non-blocking: copies on the legacy stream inside the capture block run at once, uncaptured.
        self.stream = cuda_driver._check(driver.cuStreamCreate(1), "cuStreamCreate")
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        cuda_driver._check(driver.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        self.exec = None

    def finish(self) -> None:
        driver = cuda_driver._driver()
        cuda_driver.primary_context(self.ordinal)
        try:
            graph = cuda_driver._check(driver.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
            self.exec = cuda_driver._check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
            weakref.finalize(self, _destroy_exec, self.exec, self.ordinal)
            cuda_driver._check(driver.cuGraphDestroy(graph), "cuGraphDestroy")
        finally:
            cuda_driver._check(driver.cuStreamDestroy(self.stream), "cuStreamDestroy")

    def launch(self) -> None:
        driver = cuda_driver._driver()
        cuda_driver.primary_context(self.ordinal)
        cuda_driver._check(driver.cuGraphLaunch(self.exec, driver.CUstream(0)), "cuGraphLaunch")
        if _synchronous():
            cuda_driver.synchronize(self.ordinal)
