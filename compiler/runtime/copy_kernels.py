"""`copy(dest, src, ...)`, and whole-array copies as kernel launches, so that a copy made while a Tape
records is a launch like any other: recorded with its adjoint (``adj_src += adj_dest``, in gather form: parallel and
deterministic), replayable from a step's trace, run by the native step loops and CUDA graphs; and
the entry point of a kernel that copies as it goes, without those copies (`renamed_forward`).

One small kernel module per element type holds a copy kernel for each rank (1 to 4), built on the
first copy of that type and cached on disk like every kernel module, and `add_into`'s kernel: an
elementwise sum where the arrays live (on a GPU, without moving them through the host).
"""
import numpy as np

from ..builtins import BUILTINS
from ..kernel import Kernel, KernelModule
from ..types import ArrayType
from .array import array, copy_elements
from .launch import launch, relaunch
from .tape import active_tape

__all__ = ["add_into", "copy", "copy_kernel", "is_copy_kernel", "launched_copy", "renamed_forward"]

_KERNELS: dict = {}


def copy(dest: array, src: array, dest_offset: int = 0, src_offset: int = 0, count: int | None = None):
    """Copy `count` elements (default: all of `src` from `src_offset`) from `src` into `dest`, both
    indexed as flat element sequences. Differentiable: on a tape, ``src.grad += dest.grad`` there."""
    for arg, a in (("dest", dest), ("src", src)):
        if not isinstance(a, array):
            raise TypeError(f"copy({arg}=...): expected an array, got {type(a).__name__}")
    if dest.dtype != src.dtype:
        raise TypeError(f"copy(dest, src): dtypes differ (dest {dest.dtype}, src {src.dtype})")
    for arg, v in (("dest_offset", dest_offset), ("src_offset", src_offset), ("count", count or 0)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"copy({arg}={v!r}): expected a non-negative int")
    count = src.size - src_offset if not count else count
    if src_offset + count > src.size:
        raise ValueError(f"copy(dest, src, src_offset={src_offset}, count={count}): src has only "
                         f"{src.size} elements")
    if dest_offset + count > dest.size:
        raise ValueError(f"copy(dest, src, dest_offset={dest_offset}, count={count}): dest has only "
                         f"{dest.size} elements")
    if active_tape() is not None and launched_copy(dest, src, dest_offset, src_offset, count):
        return                   # a launch like any other: recorded with its adjoint, replayable from a trace
    copy_elements("copy(dest, src)", dest, src, int(dest_offset), int(src_offset), int(count))


def launched_copy(dest, src, dest_offset: int, src_offset: int, count: int) -> bool:
    """Launch the copy kernel for `copy(dest, src, ...)` where it copies the whole of `src` onto the
    whole of `dest` (same shape, device, and not the same memory); whether it did."""
    if dest.shape != src.shape or count != src.size or dest_offset or src_offset or dest.device != src.device \
            or dest._storage is src._storage:
        return False
    launch(copy_kernel(dest.dtype, dest.ndim), dest.shape, inputs=[src], outputs=[dest])
    return True


def add_into(dest, src) -> None:
    """``dest += src`` elementwise (two contiguous arrays of one dtype, size and device), as a
    launch that no Tape records: memory arithmetic, like array._add_host, for gradients."""
    copy_kernel(dest.dtype, 1)
    relaunch(_KERNELS[(dest.dtype, "add")], (dest.size,), [dest.reshape(-1), src.reshape(-1)], deterministic=False)


def copy_kernel(dtype, ndim: int) -> Kernel:
    """The kernel ``dest[index] = src[index]`` over arrays of `dtype` and rank `ndim`."""
    key = (dtype, ndim)
    if key not in _KERNELS:
        module = KernelModule(f"compiler.copy.{dtype}")
        *copies, add = _copies(ArrayType(dtype, 1), ArrayType(dtype, 2), ArrayType(dtype, 3), ArrayType(dtype, 4))
        for rank, fn in [*enumerate(copies, start=1), ("add", add)]:
            kernel = Kernel(fn, module)
            module.add(kernel)
            _KERNELS[(dtype, rank)] = kernel
    return _KERNELS[key]


def is_copy_kernel(kernel) -> bool:
    """Whether `kernel` is one of the whole-array copy kernels (`copy_kernel`)."""
    return any(k is kernel for key, k in _KERNELS.items() if key[1] != "add")


def renamed_forward(kernel: Kernel) -> int | None:
    """The CPU entry point of `kernel`'s forward without its identity stores (`Compiled.identity`:
    the copies ``out[tid] = in[tid]`` it makes as it goes), which takes the forward's packed buffer
    (`packed_forward`), or None where it has none. Native step loops call it where they rename the
    copy's buffers instead (stepper/execute/fast/native_loop.py)."""
    import ctypes
    identity = kernel.compiled().identity
    if identity is None:
        return None
    return ctypes.cast(kernel.entry(False).function(identity.function.name, adjoint=False), ctypes.c_void_p).value


def _copies(A1, A2, A3, A4):
    """The four copy kernels' functions and add_into's, typed by this element type's arrays (this
    module does not postpone annotations, so the kernel frontend takes them as evaluated here)."""
    tid = BUILTINS["tid"]

    def copy(src: A1, dest: A1):
        i = tid()
        dest[i] = src[i]

    def copy2(src: A2, dest: A2):
        i, j = tid()
        dest[i, j] = src[i, j]

    def copy3(src: A3, dest: A3):
        i, j, k = tid()
        dest[i, j, k] = src[i, j, k]

    def copy4(src: A4, dest: A4):
        i, j, k, m = tid()
        dest[i, j, k, m] = src[i, j, k, m]

    def add(dest: A1, src: A1):
        i = tid()
        dest[i] = dest[i] + src[i]

    for fn in (copy2, copy3, copy4):
        fn.__name__ = "copy"       # messages name the kernel 'copy' whatever its rank
    return copy, copy2, copy3, copy4, add
