"""`launch`: check arguments, pack them into one buffer, run the kernel, record it on the Tape.

Argument checks name the kernel and the argument. While a Tape records, the launch is recorded
with its reads, stores and accumulations (computed at compile time), so the Tape can refuse
overwrites of data the gradient still needs, and its backward runs the generated adjoint.
"""
from __future__ import annotations

import functools
import linecache
import math
import struct

import numpy as np

from ..backends import cuda_launch, grads_variants
from ..errors import CompileError, OverwriteError, raise_if_out_of_bounds
from ..kernel import Kernel
from ..passes.bounds import check_extents
from ..types import ArrayType
from .array import array
from .device import get_device, require_cuda
from .forward_mode import active_tangents
from .graph import CapturedLaunch, capturing
from .packing import (_HEADER, _ONES, _UNREAD, LaunchError, _add_slots, _array_values, _check_argument, _dims,
                      _forward_serial, _header, _serial_flag, _signature, _slot_format, _thread_range, _zero_values)
from .tape import RecordedOp, active_tape, caller_location, settle, untaped_deterministic, zero_fresh

def launch(kernel: Kernel, dim, inputs=(), outputs=(), device=None, debug: bool = False,
           deterministic: bool | None = None) -> None:
    """Run `kernel` on every index of `dim` (an int or a tuple of up to 4 ints).

    `inputs` and `outputs` together are the kernel's arguments in order (the split only documents
    intent, as in Warp). While a `Tape` records, the launch is recorded for `tape.backward()`.
    `debug=True` checks every array index and raises instead of touching memory out of bounds.
    `deterministic=True` runs the threads serially in index order, so float atomics accumulate in the
    same order every run; by default it follows the recording Tape's `deterministic` setting.
    """
    forward_mode = active_tangents()
    if forward_mode is not None:            # inside `Tangents`: the tangent kernel runs instead
        kernel, inputs, outputs = forward_mode.tangent_launch(kernel, inputs, outputs)
    _launch(kernel, dim, inputs, outputs, device, debug, deterministic, None)


def launch_in_parts(kernel: Kernel, dim, inputs=(), outputs=(), *, first_rows: tuple, between,
                    deterministic: bool | None = None) -> bool:
    """`launch`, in parts: the threads of rows ``first_rows = (a, b)`` of tid()'s first axis run
    first, then ``between()`` is called, then the other rows run. For work that overlaps the
    launch: say, the rows that read only a block's own elements run while its halos travel, and
    `between` waits for them (stepper/distributed/domain.py). A recording Tape records one launch (the
    same adjoint, and the same bits: the threads are those of one launch, each run once).

    A kernel with atomics (whose sums depend on the order of threads), a launch inside capture(),
    or a CPU launch that a Tape holds for later (a recorded step whose outputs nothing reads: the
    stepper drops it unrun, see Tape.defer_launches) runs whole after `between()` instead; returns
    whether it ran in parts."""
    if active_tangents() is not None:       # forward mode: the tangent kernel, whole
        between()
        launch(kernel, dim, inputs, outputs, deterministic=deterministic)
        return False
    sig = _signature(kernel)
    dims = _dims(kernel, dim, sig.tid_ndim)
    a, b = first_rows
    if not (type(a) is int and type(b) is int and 0 <= a <= b <= (dims[0] if dims else 0)):
        raise LaunchError(f"launch of kernel '{kernel.__name__}' in parts: first_rows must be (a, b) with "
                          f"0 <= a <= b <= {dims[0] if dims else 0} (rows of tid()'s first axis), got {first_rows!r}")
    tape = active_tape()
    held = tape is not None and tape.defers and all(a.device == "cpu" for a in (*inputs, *outputs)
                                                        if isinstance(a, array))
    if sig.has_atomics or capturing() is not None or held:
        between()
        _launch(kernel, dims, inputs, outputs, None, False, deterministic, None)
        return False
    _launch(kernel, dims, inputs, outputs, None, False, deterministic, ((a, b), between))
    return True


def _launch(kernel: Kernel, dim, inputs, outputs, device, debug: bool, deterministic, parts) -> None:
    if not isinstance(kernel, Kernel):
        raise LaunchError(f"launch() expects a @kernel, got {type(kernel).__name__}")
    compiled = kernel.compiled()
    args = list(inputs) + list(outputs)
    sig = _signature(kernel)
    if len(args) != len(sig.params):
        names = ", ".join(p.name for p in sig.params)
        raise LaunchError(f"launch of kernel '{kernel.__name__}': expects {len(sig.params)} argument(s) ({names}), "
                          f"got {len(args)}")
    dims = _dims(kernel, dim, sig.tid_ndim)
    if device is None:
        device = next((a._device for a in args if isinstance(a, array)), "cpu")
    elif device != "cpu":
        device = str(device)
    if device != "cpu":
        device = _gpu(device)
    values = _header(dims)
    for p, expect, a in zip(sig.params, sig.expect, args):
        # the common cases first, checked without building messages
        kind = type(a)
        if kind is array:
            if type(expect) is tuple and (a._dtype is expect[0] or a._dtype == expect[0]) \
                    and a._ndim == expect[1] and a._device == device:
                values += a.__dict__.get("_launch_abi") or _array_values(a)
                continue
        elif type(expect) is frozenset and kind in expect:
            values.append(a)
            continue
        values += _check_argument(kernel, p, a, device)
    if sig.bounds and not debug:             # debug=True checks every index itself, with the index in its message
        problem = check_extents(kernel.__name__, sig.bounds, args, dims)
        if problem:
            raise LaunchError(problem)
    buffer = sig.packer.pack(*values)

    settle()                                 # launches held earlier (Tape.defer_launches) run first
    tape = active_tape()
    graph = capturing()
    if graph is not None and (tape is not None or debug):
        raise LaunchError(f"launch of kernel '{kernel.__name__}' inside capture(): " + (
            "a Tape is recording, and replays would bypass it; capture outside the Tape" if tape is not None else
            "debug=True launches cannot be captured"))
    if deterministic is None:
        deterministic = tape.deterministic if tape is not None else untaped_deterministic()
    if tape is not None:
        _record(tape, kernel, compiled, sig, args, dims, buffer, debug, deterministic, device)
    serial = _forward_serial(sig, args, deterministic)
    if parts is not None:
        _run_in_parts(kernel, compiled, sig, dims, values, parts, serial, device)
        _mark_written(sig, args, tape)
        return
    if device != "cpu":
        cuda_launch.forward(kernel, compiled, buffer, values[0], debug, serial, device, graph, _add_slots(serial, args))
        if graph is not None:
            graph.note_writes(tuple(args[k] for k in sig.written), device)
        _mark_written(sig, args, tape)
        return
    module = kernel.entry(debug)
    entry = module.function(sig.forward_name, adjoint=False)
    if graph is not None:
        graph.add(CapturedLaunch(entry, buffer, serial, tuple(args[k] for k in sig.written)), device)
    if debug or tape is None or not tape.hold(functools.partial(entry, buffer, serial)):
        entry(buffer, serial)
    if debug:
        raise_if_out_of_bounds(module, kernel)
    _mark_written(sig, args, tape)


def _run_in_parts(kernel, compiled, sig, dims, values, parts, serial, device) -> None:
    """launch_in_parts' runs: rows (a, b), then `between()`, then rows before a and from b on."""
    (a, b), between = parts
    entry = None if device != "cpu" else kernel.entry(False).function(sig.forward_name, adjoint=False)
    for rows in ((a, b), None, (0, a), (b, dims[0])):
        if rows is None:
            between()
            continue
        if rows[0] == rows[1]:
            continue
        header = _header(dims, rows)
        buffer = sig.packer.pack(*header, *values[len(header):])
        if entry is None:
            first, end = _thread_range(dims, rows)
            cuda_launch.forward(kernel, compiled, buffer, end - first, False, serial, device)   # no atomics: flag 0 or 1
        else:
            entry(buffer, serial)


def _gpu(device: str) -> str:
    """'cuda:N' for a GPU this machine has; raises RuntimeError saying what was not found otherwise."""
    dev = get_device(device)
    require_cuda(dev)
    return str(dev)


def _mark_written(sig, args, tape):
    """What array._mark_written does for every argument the kernel writes, with the tape the
    launch already looked up."""
    for k in sig.written:
        written = args[k]
        written._storage.version += 1
        if tape is not None:
            tape._note_write(written)


def _record(tape, kernel, compiled, sig, args, dims, buffer, debug, deterministic, device):
    if sig.overwrite is not None:
        loc, name = sig.overwrite
        why = compiled.uses[name].write_once_refusal
        raise OverwriteError(
            f"{loc}: kernel '{kernel.__name__}' reads array argument '{name}' and also overwrites "
            f"it (a[i] = ...) while a Tape records; the adjoint would read the overwritten values"
            + (f" (it is not provably written once, each element before it is read: {why})" if why else "")
            + ". Fix: carry a running value in a local (y = a * x[i, t] + (1 - a) * y) and store it; or "
            "write the result into a separate output array, or accumulate with a[i] += ... if that is meant.")
    if compiled.adjoint_error is not None and any(args[k].requires_grad for _, k in sig.arrays):
        e = compiled.adjoint_error
        line = linecache.getline(e.loc.filename, e.loc.lineno).rstrip("\n")
        raise CompileError(f"kernel '{kernel.__name__}' cannot be differentiated: {e}", e.loc.filename,
                           e.loc.lineno, e.loc.col, line,
                           "launch it outside the Tape, or give the function a @func_replay / @func_grad / adj_snippet")
    tape.record(_recorded_op(kernel, compiled, sig, args, dims, buffer, debug, deterministic, device,
                             caller_location()))


def _recorded_op(kernel, compiled, sig, args, dims, buffer, debug, deterministic, device, where) -> RecordedOp:
    return RecordedOp(
        sig.op_name,
        {n: args[k] for n, k in sig.reads},
        {n: args[k] for n, k in sig.writes},
        {n: args[k] for n, k in sig.accumulates},
        functools.partial(_run_adjoint, kernel, compiled, sig, args, dims, buffer, debug, deterministic),
        where,
        (kernel, dims, args, device, debug, deterministic),
        takes_fresh=True)


def relaunch(kernel: Kernel, dims: tuple, args: list, deterministic: bool, tape=None, where: str = "",
             run: bool = True, graph=None) -> None:
    """Launch again, on the device it ran on, what a checked `launch` ran before, with arguments of the same
    kinds (each array of the dtype, rank and layout that launch accepted; scalars as they were
    given): a step trace's replay (stepper/step/trace.py). Nothing is checked. With `tape`, the launch
    is recorded there as `launch` records it; ``run=False`` records it without running it (for
    outputs nothing will read: the adjoint replays the forward from the inputs). With a GPU
    `graph` (a `Graph` being captured), the launch goes into its CUDA graph instead of running."""
    compiled = kernel.compiled()
    sig = _signature(kernel)
    device = "cpu"
    values = _header(dims)
    for p, expect, a in zip(sig.params, sig.expect, args):
        if type(a) is array:
            device = a._device
            values += a.__dict__.get("_launch_abi") or _array_values(a)
        elif type(expect) is frozenset and type(a) in expect:
            values.append(a)
        else:
            values += _check_argument(kernel, p, a, device)
    buffer = sig.packer.pack(*values)
    if tape is not None:
        tape.record(_recorded_op(kernel, compiled, sig, args, dims, buffer, False, deterministic, device, where))
    if run:
        settle()
        serial = _forward_serial(sig, args, deterministic)
        if device != "cpu":
            cuda_launch.forward(kernel, compiled, buffer, values[0], False, serial, device, graph,
                                _add_slots(serial, args))
        elif graph is not None:
            raise RuntimeError("relaunch(graph=...) captures GPU launches only")
        else:
            kernel.entry(False).function(sig.forward_name, adjoint=False)(buffer, serial)
    _mark_written(sig, args, tape)


def _gather_fits(gather, sig, args, dims) -> tuple | None:
    """The index space the gather form of an adjoint runs over for this launch, or None where the
    form does not serve it. It serves where its extent source (an array it gathers into at the
    thread's own index) spans exactly the launch's index space (the thread indices tid() gives),
    every other array it gathers into spans at least that, and each of its extent bounds (a
    periodic index's divisor, a clamped index's upper bound plus one) is that axis's extent. An
    array wider than the launch widens the space along the axes the form allows it
    (`GatherAdjoint.widens`, see compiler/passes/gather.py). `dims` has the kernel's tid() axes
    (packing._dims folds a launch's extra leading axes into the first)."""
    if gather is None:
        return None
    ndim = sig.tid_ndim
    extents = tuple(dims)
    shapes = {p.name: a.shape for p, a in zip(sig.params, args) if p.name in gather.arrays}
    if shapes[gather.extent_source] != extents or any(
            len(s) != ndim or any(x < e for x, e in zip(s, extents)) for s in shapes.values()):
        return None
    space = tuple(max(s[k] for s in shapes.values()) for k in range(ndim))
    if space != extents and any(w > e and not gather.widens[k] for k, (w, e) in enumerate(zip(space, extents))):
        return None
    if gather.extent_bounds:
        shapes = {p.name: a.shape for p, a in zip(sig.params, args) if isinstance(a, array)}
        scalars = {p.name: a for p, a in zip(sig.params, args) if not isinstance(a, array)}
        if not all(d.evaluate(shapes, scalars, extents) == extents[axis] for axis, d in gather.extent_bounds):
            return None
    return space


def _fresh_mask(fresh: dict, sig, args, gathered) -> int:
    """The adjoint's fresh mask (see Tape.backward's `fresh`): bit k where parameter k's gradient
    is a pending new array that the gather form writes whole, once per element (`gathered`, and
    no other argument shares its gradient). Every other pending gradient of this launch is
    zero-filled now. Both leave `fresh`."""
    grads = [(k, args[k].grad) for _, k in sig.arrays if args[k].grad is not None]
    storages = [id(g._storage) for _, g in grads]
    mask = 0
    for k, g in grads:
        if fresh.get(id(g._storage)) is g and sig.params[k].name in gathered and k < 63 \
                and storages.count(id(g._storage)) == 1:
            del fresh[id(g._storage)]
            mask |= 1 << k
        else:
            zero_fresh(fresh, g)
    return mask


def _adjoint_setup(compiled, sig, args, dims, serial, fresh):
    """(the adjoint IR function to run, its packed gradient buffer, its serial flag, the threads it
    runs, the gradient mask of its specialised entry or None: see grads_variants.grads_mask) for a launch whose arguments carry their gradients in ``.grad``; zero-fills the pending
    `fresh` gradients that it does not overwrite whole (see _fresh_mask)."""
    space = _gather_fits(compiled.gather, sig, args, dims)
    gather = compiled.gather if space is not None else None
    # The gradient buffer's launch_t: its first word is the fresh mask, its dims a gather form's
    # wider index space (sp::widen in prelude.h; zeros: the launch's own), the rest unread.
    wide = space is not None and space != tuple(dims)
    values = [_fresh_mask(fresh, sig, args, gather.arrays if gather else ()) if fresh else 0,
              *((*space, *_ONES[len(space):], 0, 0, 0, 0) if wide else _UNREAD)]
    for p, a in zip(sig.params, args):
        if isinstance(p.type, ArrayType):
            values += _array_values(a.grad if a.requires_grad else None, like=a)
        else:
            values += _zero_values(p.type)
    adj_buffer = sig.packer.pack(*values)
    adjoint = compiled.adjoint
    gathered = gather.arrays if gather is not None else ()
    # Only gradients that exist receive adds: an input without one (a table, a series) is no target.
    targets = [args[k] for n, k in sig.read_arrays if n not in gathered and args[k].requires_grad]
    if gather is not None:
        # Parallel and deterministic by construction; serial only for what still scatters into a
        # gradient the launch has (a constant coefficient table's adds are compiled out).
        adjoint, serial = gather.function, serial and gather.scatters and bool(targets)
    serial = _serial_flag(serial, sig.adjoint_logs_adds, targets)
    grads = grads_variants.grads_mask(sig.gather_grads, args) if gather is not None else None
    return adjoint, adj_buffer, serial, math.prod(space if wide else dims), grads


def packed_adjoint(kernel: Kernel, dims: tuple, args: list, deterministic: bool, fresh: dict, device: str = "cpu"):
    """What a recorded launch's adjoint would run in `Tape.backward` (the arguments' ``.grad`` set,
    `fresh` its pending new gradients, zero-filled here as backward would), unrun: ``(entry, packed
    gradient buffer, serial flag)``, or None where the kernel has no adjoint. On the CPU `entry` is
    the address of ``int f(buffer, adj_buffer, tape, capacity, count_only, counts, serial)``; on a
    GPU a function ``run(buffer, adj_buffer)`` that queues the adjoint with buffers of those bytes.
    Kernels whose adjoint keeps a loop tape are refused (ValueError): they need per-call memory."""
    import ctypes
    compiled = kernel.compiled()
    if compiled.adjoint is None:
        return None
    if compiled.needs_tape:
        raise ValueError(f"kernel '{kernel.__name__}': its adjoint keeps a loop tape")
    sig = _signature(kernel)
    function, adj_buffer, serial, threads, grads = _adjoint_setup(compiled, sig, args, dims, deterministic, fresh)
    if device != "cpu":
        add_slots = _add_slots(serial, args)
        if grads is not None:       # built now, not in the first run (which a graph may capture)
            grads_variants.cuda_functions(kernel, compiled, grads, get_device(device))

        def run(buffer: bytes, adj: bytes) -> None:
            cuda_launch.adjoint(kernel, compiled, function, buffer, adj, threads, False, serial, device, add_slots,
                                grads, dims)
        return run, adj_buffer, serial
    entry = grads_variants.cpu_adjoint_entry(kernel, compiled, function, grads, False)
    return ctypes.cast(entry, ctypes.c_void_p).value, adj_buffer, serial


def _run_adjoint(kernel, compiled, sig, args, dims, buffer, debug, serial, fresh=None):
    if compiled.adjoint is None:
        return
    device = next((a.device for a in args if isinstance(a, array)), "cpu")
    adjoint, adj_buffer, serial, threads, grads = _adjoint_setup(compiled, sig, args, dims, serial, fresh)
    if device != "cpu":
        cuda_launch.adjoint(kernel, compiled, adjoint, buffer, adj_buffer, threads, debug, serial, device,
                            _add_slots(serial, args), grads, dims)
        return
    module = kernel.entry(debug)
    fn = grads_variants.cpu_adjoint_entry(kernel, compiled, adjoint, grads, debug)
    n = math.prod(dims)
    tape_memory, capacity = None, 0
    if compiled.needs_tape and n > 0:
        counts = np.zeros(n, np.int64)
        fn(buffer, adj_buffer, None, 0, 1, counts.ctypes.data, serial)
        capacity = int(counts.max())
        try:
            tape_memory = np.empty(capacity * n, np.uint64)
        except MemoryError:
            raise MemoryError(f"{compiled.forward.loc}: the adjoint of kernel '{kernel.__name__}' needs "
                              f"{capacity * n * 8 / 2**20:.1f} MiB for the values its loops carry "
                              f"({capacity} words per thread x {n} threads) and could not allocate it") from None
    overflow = fn(buffer, adj_buffer, tape_memory.ctypes.data if tape_memory is not None else None, capacity, 0, None,
                  serial)
    if debug:
        raise_if_out_of_bounds(module, kernel)
    if overflow:
        raise RuntimeError(f"internal error: the adjoint of kernel '{kernel.__name__}' overflowed its measured tape "
                           f"({capacity} words per thread); please report this with the kernel's source")


def _packed_values(kernel: Kernel, sig, dims: tuple, args: list, device: str) -> tuple[list, list]:
    """`relaunch`'s launch_t values for these arguments, and the byte offset in the packed buffer of
    each argument's data pointer (None for a non-array)."""
    values = _header(dims)
    offsets, fmt = [], "<" + _HEADER
    for p, expect, a in zip(sig.params, sig.expect, args):
        offsets.append(struct.calcsize(fmt) if isinstance(p.type, ArrayType) else None)
        fmt += _slot_format(p.type)
        if type(a) is array:
            values += a.__dict__.get("_launch_abi") or _array_values(a)
        elif type(expect) is frozenset and type(a) in expect:
            values.append(a)
        else:
            values += _check_argument(kernel, p, a, device)
    return values, offsets


def packed_forward(kernel: Kernel, dims: tuple, args: list, deterministic: bool, device: str = "cpu"):
    """What `relaunch` would run, unrun: ``(entry, packed buffer, serial flag, offsets)``, where
    ``offsets[k]`` is the byte offset in the buffer of argument k's data pointer (None for a
    non-array). On the CPU `entry` is the address of ``void f(const char* buffer, int serial)``,
    which a native driver (stepper/execute/fast/native_loop.py) calls itself, patching array pointers between
    calls; on a GPU a function ``run(buffer)`` that queues the launch with a buffer of those bytes."""
    import ctypes
    sig = _signature(kernel)
    values, offsets = _packed_values(kernel, sig, dims, args, device)
    serial = _forward_serial(sig, args, deterministic)
    if device != "cpu":
        compiled, n, add_slots = kernel.compiled(), values[0], _add_slots(serial, args)

        def run(buffer: bytes) -> None:
            cuda_launch.forward(kernel, compiled, buffer, n, False, serial, device, None, add_slots)
        return run, sig.packer.pack(*values), serial, offsets
    entry = kernel.entry(False).function(sig.forward_name, adjoint=False)
    return ctypes.cast(entry, ctypes.c_void_p).value, sig.packer.pack(*values), serial, offsets
