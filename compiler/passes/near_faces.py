"""Variants of a gather form (compiler/passes/gather.py) and of a forward for the threads near a
launch's faces.

A thread within a stencil's radius of a face runs the form's general function: every pass of the
stencil, each clamped into the launch and tested, where only the neighbours that reach it
contribute. Its variants here are the same functions settled (interior.settled_over) over a box
along the faces: a row's first and last threads, the first and last rows along an outer axis, the
bands between two boxes of a row. The tests that the box decides fold away, and dead code
elimination drops what they discarded: of a radius-R stencil's passes R stay, and a pass that
only runs inside the launch's interior (an FWI step's pointwise one) leaves nothing. A forward's
rows' ends and the rows along its faces (`with_sides`) likewise keep only what writes the stencil's
boundary value.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from .dce import eliminate_dead_code
from .interior import Bound, Interior, settled_over


def without_dead_code(variant: Interior | None) -> Interior | None:
    """`variant` and its row variant, each function without what its settled tests left dead."""
    if variant is None:
        return None
    return dataclasses.replace(variant, function=eliminate_dead_code(variant.function),
                               row=without_dead_code(variant.row))


def sides_of(fn: ir.Function, interior: Interior, source: str, same, axis: int) -> tuple | None:
    """(first, last): `fn` settled along `axis` over [0, m) and over [n - m', n), where m is the
    largest constant lower margin of `interior`'s box on that axis, n the launch's extent there (the
    extent of `source`) and n - m' its smallest upper bound of that form; either None where nothing
    settles there. Along the innermost axis: a row's first and last threads; along an outer one,
    the first and last rows. Such a thread ran all of a stencil's passes (25 at 8th order in 3-D)
    where at most R (4) contribute; settled, those R stay. A 3-D 64^3 8th-order float32 wave's
    adjoint (a third of its threads lie there): 1153 us without, 752 with the rows' ends settled,
    662 with the outer rows too (its forward: 310)."""
    extent, start, end = _faces(interior, axis, source, same)
    first = settled_over(fn, f"{fn.name}_first{axis}", {axis: ((Bound(0),), (start,))}, same) \
        if start is not None else None
    last = settled_over(fn, f"{fn.name}_last{axis}", {axis: ((end,), (extent,))}, same) \
        if end is not None else None
    return _pair(first, last)


def with_sides(interior: Interior | None, fn: ir.Function) -> Interior | None:
    """`interior` (a forward's, of `fn`) with `row_ends` and `face_rows`: `fn` settled along each
    axis over the threads below the box's largest constant margin there and over those from the
    box's end to the launch's. A stencil writes its rule's boundary value there (an FWI step a
    zero), where the whole body ran a thread at a time. Along the innermost axis those are a row's
    ends (5% of a 3-D FWI forward at 128^3 + its damping layer, 8th order); along an outer one,
    whole rows (7% of the 2-D 256^2 + 40 FWI forward at 8th order, in rows that store zeros).
    Settled, their tests fold and the loads they guarded go (same statements otherwise: the same
    bits)."""
    if interior is None or fn.tid_ndim < 2:
        return interior
    sides = tuple(_sides(interior, fn, axis) for axis in range(fn.tid_ndim))
    return dataclasses.replace(interior, row_ends=sides[-1], face_rows=sides[:-1])


def _sides(interior: Interior, fn: ir.Function, axis: int) -> tuple | None:
    """(first, last): `fn` settled along `axis` over [0, margin) and over [box end, launch extent)."""
    start = margin(interior, axis)
    first = settled_over(fn, f"{fn.name}_first{axis}", {axis: ((Bound(0),), (start,))}) \
        if start is not None else None
    extent = Bound(0, ((1, ("extent", axis)),))
    last = settled_over(fn, f"{fn.name}_last{axis}", {axis: (interior.upper[axis], (extent,))}) \
        if interior.upper[axis] else None
    return _pair(first, last)


def bands_of(interior: Interior, settled: Interior, source: str, same) -> tuple | None:
    """(first, last): `interior`'s function settled over the rows in `settled`'s box, along the
    innermost axis over the interior box's first threads up to `settled`'s box (the largest
    constant among its lower bounds) and from the smallest of `settled`'s upper bounds of the form
    extent - m on; either None where nothing settles. The bounds of the other box count too (the
    first band ends before the settled box's end, the last starts after its start), so that both
    the guards below and those above settle."""
    inner = interior.function.tid_ndim - 1
    _, start, end = _faces(settled, inner, source, same)
    if start is None or end is None:
        return None
    fn = interior.function
    rows = {k: (settled.lower[k], settled.upper[k]) for k in range(inner)}       # (the settled box's rows)
    first = settled_over(fn, fn.name + "_band_first", {**rows, inner: (interior.lower[inner],
                                                                       (start, *settled.upper[inner]))}, same)
    last = settled_over(fn, fn.name + "_band_last", {**rows, inner: ((end, start), interior.upper[inner])}, same)
    return _pair(first, last)


def _faces(box: Interior, axis: int, source: str, same) -> tuple:
    """(n, m, n - m') along `axis` of `box`: the extent of `source` (the launch's), its largest
    constant lower bound and its smallest upper bound of the form n - m' (None where it has none)."""
    extent = Bound(0, ((1, ("dim", source, axis)),))
    tails = [(same(b) - extent).const for b in box.upper[axis] if not (same(b) - extent).terms]
    return extent, margin(box, axis), extent.shifted(min(tails)) if tails else None


def margin(box: Interior, axis: int) -> Bound | None:
    """The largest constant among `box`'s lower bounds along `axis` (None where it has none): a
    stencil's radius there, for a gather form's box."""
    margins = [b.const for b in box.lower[axis] if not b.terms]
    return Bound(max(margins)) if margins else None


def _pair(first: Interior | None, last: Interior | None) -> tuple | None:
    """(first, last) without what their settled tests left dead, or None where both are None."""
    first, last = without_dead_code(first), without_dead_code(last)
    return (first, last) if first is not None or last is not None else None


__all__ = ["bands_of", "margin", "sides_of", "with_sides", "without_dead_code"]
