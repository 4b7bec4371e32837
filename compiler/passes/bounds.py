"""Which arrays a kernel indexes with its thread index on every thread, so `launch` can check them.

A kernel that writes ``out[i]`` with ``i = tid()`` at its top level (outside any ``if`` or loop: every
thread runs it) touches element ``dim - 1``; a launch whose ``dim`` exceeds the array's extent would
write past the buffer and corrupt the heap, and the process would abort later, far from the cause.
This compile-time analysis (the same thread-index tracking the gather form of adjoints uses) lets
`launch` refuse such a launch with a `LaunchError` for the price of one comparison per array. Indices
that are guarded or computed any other way are left to ``debug=True``, which checks every access.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .interior import tid_offsets

__all__ = ["TidIndexed", "row_reach", "tid_indexed"]


@dataclass(frozen=True)
class TidIndexed:
    """Array parameter `param` (its position) is indexed on axis `axis` with ``tid()[tid_axis] +
    offset`` on every thread: a launch needs ``shape[axis] >= dim[tid_axis] + offset``."""
    param: int
    name: str
    axis: int
    tid_axis: int
    offset: int
    loc: ir.Loc


def tid_indexed(forward: ir.Function) -> tuple[TidIndexed, ...]:
    """The strictest requirement per (array, axis, thread axis), from top-level loads, stores and
    atomics of `forward` whose index is a thread index plus a constant >= 0."""
    offsets = tid_offsets(forward.body, forward.tid_ndim)
    found: dict[tuple, TidIndexed] = {}
    for s in forward.body:                       # top level only: statements every thread runs
        if not isinstance(s, (ir.Load, ir.Store, ir.Atomic)) or s.array.adjoint:
            continue
        for axis, index in enumerate(s.indices):
            known = offsets.get(index.id) if isinstance(index, ir.Temp) else None
            if not (isinstance(known, tuple) and not known[1].terms and known[1].const >= 0):
                continue
            need = TidIndexed(s.array.param.index, s.array.param.name, axis, known[0], known[1].const, s.loc)
            key = (need.param, axis, need.tid_axis)
            if key not in found or found[key].offset < need.offset:
                found[key] = need
    return tuple(found.values())


def check_extents(kernel_name: str, needs: tuple[TidIndexed, ...], args, dims: tuple) -> str | None:
    """The message for the first array too small for `dims`, or None."""
    for need in needs:
        shape = args[need.param].shape
        if shape[need.axis] < dims[need.tid_axis] + need.offset:
            plus = f" + {need.offset}" if need.offset else ""
            return (f"launch of kernel '{kernel_name}': argument '{need.name}' has shape {tuple(shape)}, but the "
                    f"kernel indexes its axis {need.axis} with tid(){f'[{need.tid_axis}]' if len(dims) > 1 else ''}"
                    f"{plus} on every thread ({need.loc}) and dim={dims if len(dims) > 1 else dims[0]} needs at "
                    f"least {dims[need.tid_axis] + need.offset} there; launch over the array's extent or pass "
                    "a larger array")
    return None


def row_reach(forward: ir.Function, name: str) -> tuple[int, int] | None:
    """(lo, hi) such that every access of array parameter `name` in `forward` (loads, stores and
    atomics anywhere: under branches and in loops too) is at row ``tid()[0] + c`` of its first
    axis with ``lo <= c <= hi``, so thread i touches rows i + lo .. i + hi and no others; None when
    some access is indexed otherwise there, or `name` is not accessed at all. A halo exchange uses it
    to tell which threads read only a block's own rows (stepper/distributed/domain.py)."""
    offsets = tid_offsets(forward.body, forward.tid_ndim)
    reach = None
    for s in ir.walk(forward.body):
        if not isinstance(s, (ir.Load, ir.Store, ir.Atomic)) or s.array.adjoint or s.array.param.name != name:
            continue
        index = s.indices[0] if s.indices else None
        known = offsets.get(index.id) if isinstance(index, ir.Temp) else None
        if not (isinstance(known, tuple) and known[0] == 0 and not known[1].terms):
            return None
        c = known[1].const
        reach = (c, c) if reach is None else (min(reach[0], c), max(reach[1], c))
    return reach
