"""How a launch packs its arguments: each kernel's packing plan (`_Signature`, built once), the
argument checks that name the kernel and the argument, launch_t's header, and the `serial` flag
that decides how a deterministic launch orders its float adds.

One buffer per launch holds launch_t (prelude.h: the thread count, dims, the thread range, the add
tables) followed by one slot per argument; every entry point (the CPU library's, CUDA's, the native
drivers' in stepper/) reads it in this layout.
"""
from __future__ import annotations

import math
import struct

import numpy as np

from ..codegen.targets import gather_grad_params
from ..kernel import Kernel
from ..passes.bounds import tid_indexed
from ..types import ArrayType, ScalarType, VectorType
from .array import array

_HEADER = "q4qqqqq"         # launch_t: n, dim[4], first, end, adds, add_slots
_ONES = (1, 1, 1, 1)
_NO_ADD_TABLES = (0, 0)      # launch_t's adds, add_slots: set only by a GPU launch that logs its adds
_UNREAD = (0,) * 8
_MAX_THREADS = 2**31
_SCALAR_FORMATS = {"float32": "f4x", "float64": "d", "int32": "i4x", "int64": "q", "bool": "?7x"}
_PYTHON_KINDS = {"float32": (float, int), "float64": (float, int), "int32": (int,), "int64": (int,), "bool": (bool,)}


class LaunchError(ValueError):
    pass


def _slot_format(t) -> str:
    if isinstance(t, ArrayType):
        return "Q4q4q"
    if isinstance(t, ScalarType):
        return _SCALAR_FORMATS[t.name]
    n = t.length if isinstance(t, VectorType) else t.rows * t.cols
    code = "f" if t.scalar.name == "float32" else "d"
    size = n * t.scalar.size
    return f"{n}{code}" + (f"{(-size) % 8}x" if size % 8 else "")


class _Signature:
    """Per-kernel packing plan, built once."""

    def __init__(self, kernel: Kernel):
        compiled = kernel.compiled()
        self.params = kernel.params
        self.tid_ndim = compiled.forward.tid_ndim
        uses = [compiled.uses.get(p.name) for p in self.params]
        self.written = [k for k, u in enumerate(uses) if u is not None and (u.stores or u.accumulates)]
        self.has_atomics = any(u is not None and u.accumulates for u in uses)
        # A deterministic launch that adds into a few elements runs in parallel and logs its adds
        # (add_log in prelude.h) where deferring them cannot change what any thread sees: the
        # forward never reads, stores to or uses the result of what it accumulates into; the
        # adjoint never both reads and accumulates one gradient (it reads the gradients of what
        # the forward writes, and scatters into those of what it reads).
        self.forward_logs_adds = all(not (u.reads or u.stores) for u in uses if u is not None and u.accumulates)
        self.adjoint_logs_adds = not any((u.reads or u.adjoint_reads) and (u.stores or u.accumulates)
                                         for u in uses if u is not None)
        self.read_arrays = [(p.name, k) for k, (p, u) in enumerate(zip(self.params, uses))
                            if u is not None and (u.reads or u.adjoint_reads)]
        self.packer = struct.Struct("<" + _HEADER + "".join(_slot_format(p.type) for p in self.params))
        # What the common launch compares each argument with: (dtype, ndim) for an array, the Python
        # types passed through as they are for a scalar, None for vectors and matrices.
        self.expect = [(p.type.dtype, p.type.ndim) if isinstance(p.type, ArrayType) else
                       frozenset(_PYTHON_KINDS[p.type.name]) if isinstance(p.type, ScalarType) else None
                       for p in self.params]
        self.forward_name = compiled.forward.name
        # What a recorded launch reads, writes and accumulates into, as (argument name, index).
        # A @func_replay reading back what this launch stored is the intended pattern, not a conflict.
        # Values a kernel reads back after storing them are its own output, not a dependency.
        self.arrays = [(p.name, k) for k, p in enumerate(self.params) if isinstance(p.type, ArrayType)]
        use = {name: compiled.uses[name] for name, _ in self.arrays if name in compiled.uses}
        self.reads = [(n, k) for n, k in self.arrays if n in use and (
            use[n].reads and (not use[n].stores or use[n].overwrites_read) or use[n].adjoint_reads and not use[n].stores)]
        self.writes = [(n, k) for n, k in self.arrays if n in use and use[n].stores]
        self.accumulates = [(n, k) for n, k in self.arrays if n in use and use[n].accumulates]
        self.overwrite = next(((u.overwrites_read, n) for n, u in compiled.uses.items()
                               if u.overwrites_read is not None), None)
        self.op_name = f"launch of kernel '{kernel.__name__}'"
        self.bounds = tid_indexed(compiled.forward)      # arrays whose extent the launch's dim must fit
        gather = compiled.gather
        # the gather form's gradient mask bits (see grads_variants.grads_mask)
        self.gather_grads = gather_grad_params(gather) if gather is not None else ()


# Elements an accumulation may target for a deterministic launch to log its adds in parallel
# rather than run serially: with few targets every chunk's log is a few partial sums, while a
# scatter over many elements logs every add, and replaying the logs then cost more than the
# serial run on our 2-core machines (cloth 200 x 200: 3.4 s against 2.3 s a gradient).
FEW_ELEMENTS = 64


def _serial_flag(deterministic: bool, logs_adds: bool, targets=()) -> int:
    """The entries' `serial` argument: 0 parallel (atomics in any order), 1 one thread in index
    order, 2 parallel in fixed chunks whose adds into `targets` (the arrays it accumulates into,
    each of at most FEW_ELEMENTS; an iterable, read only when it matters) are summed per chunk and
    applied in chunk order."""
    if not deterministic:
        return 0
    return 2 if logs_adds and all(math.prod(a.shape) <= FEW_ELEMENTS for a in targets) else 1


def _add_slots(serial: int, args) -> int:
    """For a launch that logs its adds (flag 2) on a GPU: a bound on the elements it adds into,
    which each chunk keeps a partial for. Every array it accumulates into (or into whose gradient)
    has at most FEW_ELEMENTS elements, so all such arguments, counted in scalars, bound them."""
    if serial != 2:
        return 0
    return sum(math.prod(a.shape) * math.prod(a.dtype.inner_shape) for a in args
               if isinstance(a, array) and math.prod(a.shape) <= FEW_ELEMENTS)


def _forward_serial(sig, args, deterministic: bool) -> int:
    """The forward entry's `serial` argument (see _serial_flag): only atomics depend on thread order."""
    return _serial_flag(deterministic and sig.has_atomics, sig.forward_logs_adds, (args[k] for _, k in sig.accumulates))


def _signature(kernel: Kernel) -> _Signature:
    sig = getattr(kernel, "_signature", None)
    if sig is None:
        sig = kernel._signature = _Signature(kernel)
    return sig


def _dims(kernel: Kernel, dim, tid_ndim: int) -> tuple[int, ...]:
    if type(dim) is int and 0 <= dim < _MAX_THREADS and tid_ndim == 1:
        return (dim,)
    if type(dim) is tuple and len(dim) == tid_ndim == 2 and type(dim[0]) is int and type(dim[1]) is int \
            and 0 <= dim[0] < 2**15 and 0 <= dim[1] < 2**15:
        return dim                            # the common 2-d launch, under 2**31 threads by construction
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    if not 1 <= len(dims) <= 4 or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise LaunchError(f"launch of kernel '{kernel.__name__}': dim must be a non-negative int or a tuple of 1 to 4 "
                          f"of them, got {dim!r}")
    ndim = tid_ndim
    if len(dims) < ndim:
        raise LaunchError(f"launch of kernel '{kernel.__name__}': the kernel unpacks {ndim} indices from tid() but "
                          f"dim={dim!r} has {len(dims)}; pass a {ndim}-tuple")
    if math.prod(dims) >= _MAX_THREADS:
        raise LaunchError(f"launch of kernel '{kernel.__name__}': dim={dim!r} is {math.prod(dims)} threads; thread "
                          f"indices are int32, so a launch has fewer than 2**31 threads: loop inside the kernel")
    if len(dims) > ndim:
        # tid() unpacks `ndim` indices: the first spans the launch's leading axes, the others its last
        # ones. Folded here, so that the entries, the extent checks and the gather form all see the
        # index space the kernel does (each read the axes its own way before: a 2-D kernel launched
        # over (2, 3, 4) ran i0 < 8, i1 < 3 and was checked against (2, 3), writing past a (6, 4) array).
        dims = (math.prod(dims[:len(dims) - ndim + 1]), *dims[len(dims) - ndim + 1:])
    return tuple(int(d) for d in dims)


def _header(dims: tuple, rows: tuple | None = None) -> list:
    """launch_t's values for a launch over `dims` that runs every thread, or only the threads of
    `rows` = (first, end) of its first axis."""
    n = math.prod(dims)
    first, end = _thread_range(dims, rows)
    return [n, *dims, *_ONES[len(dims):], first, end, *_NO_ADD_TABLES]


def _thread_range(dims: tuple, rows: tuple | None) -> tuple[int, int]:
    """The flat thread indices [first, end) of `rows` of the first axis (all threads for None)."""
    n = math.prod(dims)
    return (0, n) if rows is None else (rows[0] * n // dims[0], rows[1] * n // dims[0])


def _array_values(a: array | None, like: array | None = None) -> list:
    if a is None:
        shape = list(like.shape) if like is not None else []
        return [0] + shape + [0] * (4 - len(shape)) + [0, 0, 0, 0]
    # An array's memory never moves, so its argument slot is computed once.
    abi = a.__dict__.get("_launch_abi")
    if abi is None:
        shape, strides = list(a.shape), list(a.strides)
        contiguous = [a.dtype.size * math.prod(shape[k + 1:]) for k in range(len(shape))]
        if strides != contiguous and a.size > 1:
            raise LaunchError(f"array {a!r} is not C-contiguous (strides {tuple(strides)}); kernels index "
                              "contiguous memory: pass stepper.clone(a)")
        abi = a._launch_abi = [a.ptr] + shape + [0] * (4 - len(shape)) + strides + [0] * (4 - len(strides))
    return abi


def _zero_values(t) -> list:
    if isinstance(t, ScalarType):
        return [False] if t.name == "bool" else [0]
    return [0.0] * math.prod(t.inner_shape)


def _check_argument(kernel, p, value, device):
    if isinstance(p.type, ArrayType) and type(value) is array and value._dtype == p.type.dtype \
            and value._ndim == p.type.ndim and value._device == device:
        return _array_values(value)          # the common case, checked without building messages
    where = f"launch of kernel '{kernel.__name__}': argument '{p.name}'"
    if isinstance(p.type, ArrayType):
        if not isinstance(value, array):
            hint = getattr(value, "launch_hint", "wrap data with stepper.array(...)")
            raise LaunchError(f"{where} expects {p.type}, got {type(value).__name__}; {hint}")
        if value.dtype != p.type.dtype or value.ndim != p.type.ndim:
            raise LaunchError(f"{where} expects {p.type}, got an array of {value.dtype} with {value.ndim} dimension(s)")
        if value.device != device:
            raise LaunchError(f"{where} is on {value.device}, but the launch runs on {device}; move it with .to('{device}')")
        return _array_values(value)
    t = p.type
    if isinstance(t, ScalarType):
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool) and t.name != "bool" or not isinstance(value, _PYTHON_KINDS[t.name]):
            raise LaunchError(f"{where} expects a {t}, got {type(value).__name__} {value!r}")
        return [value]
    flat = np.asarray(value, dtype=t.np_dtype)
    if flat.shape != t.inner_shape:
        raise LaunchError(f"{where} expects a {t} (shape {t.inner_shape}), got shape {flat.shape}")
    return flat.ravel().tolist()
